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
