//! The admin listener: health, readiness and Prometheus metrics.
mod common;

use common::*;

#[tokio::test]
async fn health_readiness_and_a_metric_that_moves() {
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    cfg.set("admin.enabled", true);
    cfg.set("admin.listen", "127.0.0.1:0");
    let path = cfg.write();
    let seed = seed(&path, "acme", "alice", "owner", "clusters:read");
    let gw = Gateway::start(&path);
    let admin = gw.admin.expect("admin listener address logged");
    let c = client();

    let res = c
        .get(format!("http://{admin}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let res = c
        .get(format!("http://{admin}/readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let ready: serde_json::Value = res.json().await.unwrap();
    assert_eq!(ready["store"], "ok");
    assert_eq!(ready["rate_limiter"]["backend"], "local");

    let metric = "mpg_requests_total{route=\"/api/v1/clusters\",method=\"GET\",status=\"200\"}";
    let count = |text: &str| -> u64 {
        text.lines()
            .find(|l| l.starts_with(metric))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .map(|v| v as u64)
            .unwrap_or(0)
    };
    let before = count(
        &c.get(format!("http://{admin}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    );
    for _ in 0..3 {
        let res = c
            .get(gw.url("/api/v1/clusters?organization_id=acme"))
            .bearer_auth(&seed.key)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
    }
    let text = c
        .get(format!("http://{admin}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(count(&text), before + 3, "{text}");
    assert!(text.contains("mpg_request_duration_seconds"), "{text}");
    // The first request missed the key cache, so the store was asked and timed.
    assert!(
        text.lines()
            .any(|l| l.starts_with("mpg_store_query_duration_seconds_count ") && !l.ends_with(" 0")),
        "{text}"
    );
    assert!(!text.contains(&seed.key[4..]), "a secret reached /metrics");
    let res = c.get(format!("http://{admin}/nope")).send().await.unwrap();
    assert_eq!(res.status(), 404);
}

/// A gateway with its admin listener on, answering also for `gw-1.internal`
/// (the config is kept: a reload reads it).
async fn admin_world() -> (MockUpstream, TestConfig, Gateway, std::net::SocketAddr) {
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    cfg.set("admin.enabled", true);
    cfg.set("admin.listen", "127.0.0.1:0");
    cfg.set("admin.allowed_hosts", vec!["GW-1.internal"]);
    let gw = Gateway::start(&cfg.write());
    let admin = gw.admin.expect("admin listener address logged");
    (up, cfg, gw, admin)
}

/// One request to the admin listener with the given Host and extra header lines.
async fn admin_raw(
    admin: std::net::SocketAddr,
    line: &str,
    host: &str,
    headers: &str,
) -> RawResponse {
    let req = format!("{line} HTTP/1.1\r\nHost: {host}\r\n{headers}Content-Length: 0\r\nConnection: close\r\n\r\n");
    raw(admin, req.as_bytes()).await
}

/// `mpg_config_reloads_total{result="ok"}`.
async fn reloads(admin: std::net::SocketAddr) -> u64 {
    let text = admin_raw(admin, "GET /metrics", "localhost", "").await.body;
    text.lines()
        .find(|l| l.starts_with("mpg_config_reloads_total{result=\"ok\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map(|v| v as u64)
        .unwrap_or(0)
}

#[tokio::test]
async fn reload_refuses_what_a_browser_page_could_send() {
    let (_up, _cfg, _gw, admin) = admin_world().await;
    let host = admin.to_string();
    for headers in [
        "Origin: http://evil.example\r\n",
        // Same-origin still: no page should drive the admin listener.
        &format!("Origin: http://{admin}\r\n"),
        "Origin: null\r\n",
        "Content-Type: text/plain\r\n",
        "Content-Type: application/x-www-form-urlencoded\r\n",
        "Content-Type: multipart/form-data; boundary=x\r\n",
    ] {
        let res = admin_raw(admin, "POST /reload", &host, headers).await;
        assert_eq!(res.status, 403, "{headers:?}: {res:?}");
        assert_eq!(res.header("content-type"), Some("application/json"));
        let body = res.json();
        assert_eq!(body["error"], "Forbidden", "{body}");
        assert_eq!(body["details"]["reason"], "cross_site", "{body}");
    }
    assert_eq!(reloads(admin).await, 0, "a refused reload reloaded");
    // What curl and scripts send: no Origin, no body or a JSON one.
    for headers in ["", "Content-Type: application/json\r\n"] {
        let res = admin_raw(admin, "POST /reload", &host, headers).await;
        assert_eq!(res.status, 200, "{headers:?}: {res:?}");
        assert_eq!(res.json()["status"], "reloaded");
    }
    assert_eq!(reloads(admin).await, 2);
}

#[tokio::test]
async fn the_admin_listener_answers_only_hosts_that_name_it() {
    let (_up, _cfg, _gw, admin) = admin_world().await;
    let port = admin.port();
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "localhost".to_string(),
        format!("[::1]:{port}"),
        // Through a port forward the port differs; the name is what matters.
        "localhost:8080".to_string(),
        format!("gw-1.internal:{port}"),
    ] {
        let res = admin_raw(admin, "GET /healthz", &host, "").await;
        assert_eq!(res.status, 200, "{host}: {res:?}");
    }
    // A DNS-rebinding page: its own name, resolved to the listener.
    for host in [
        format!("evil.example:{port}"),
        "localhost.evil.example".to_string(),
        format!("10.9.9.9:{port}"),
    ] {
        for line in ["GET /healthz", "GET /metrics", "POST /reload"] {
            let res = admin_raw(admin, line, &host, "").await;
            assert_eq!(res.status, 421, "{line} with {host}: {res:?}");
            assert_eq!(res.header("content-type"), Some("application/json"));
            assert_eq!(res.json()["error"], "MisdirectedRequest", "{res:?}");
        }
    }
    assert_eq!(reloads(admin).await, 0, "a misdirected reload reloaded");
}
