//! A store that cannot be reached at start, with a real PostgreSQL of the
//! test's own, not yet started: by default the gateway listens anyway, says
//! 503 (readiness and requests, with `Retry-After`, never 401), and serves
//! once the database answers; `[store] wait_at_start = false` exits.
mod common;

use common::backends::{free_port, OwnPostgres};
use common::*;
use std::process::Command;
use std::time::{Duration, Instant};

async fn status(url: String, key: Option<&str>) -> (u16, Option<String>) {
    let mut req = client().get(url);
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    match req.send().await {
        Ok(res) => (
            res.status().as_u16(),
            res.headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_string()),
        ),
        Err(_) => (0, None),
    }
}

#[tokio::test]
async fn a_gateway_started_with_postgresql_down_answers_503_then_serves_once_it_answers() {
    let pg = OwnPostgres::init(false);
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    cfg.postgres(&pg.url("postgres", ""));
    cfg.set("admin.enabled", true);
    cfg.set("admin.listen", "127.0.0.1:0");
    let path = cfg.write();
    let gw = Gateway::start(&path);
    let ready = format!("http://{}/readyz", gw.admin.unwrap());
    let clusters = gw.url("/api/v1/clusters?organization_id=acme");
    // A well-formed key nobody knows: with the store down it is not called bad.
    let (unknown, _) = mpg_gateway::secret::generate_api_key();

    assert_eq!(status(ready.clone(), None).await.0, 503);
    let (code, retry) = status(clusters.clone(), Some(&unknown)).await;
    assert_eq!(code, 503, "a lookup with the store down");
    assert!(retry.is_some(), "503 with Retry-After");
    let log = gw.log_text();
    assert_eq!(
        log.matches("the store cannot be reached at start").count(),
        1,
        "one incident line: {log}"
    );

    pg.run();
    let start = Instant::now();
    while status(ready.clone(), None).await.0 != 200 {
        assert!(
            start.elapsed() < Duration::from_secs(45),
            "never ready: {}",
            gw.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The schema is in place: the admin commands work against it, and the
    // gateway serves what they made.
    let seed = seed(&path, "acme", "alice", "admin", "clusters:read");
    let start = Instant::now();
    loop {
        let (code, _) = status(clusters.clone(), Some(&seed.key)).await;
        if code == 200 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "still {code}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status(clusters, Some(&unknown)).await.0, 401);
    assert_eq!(
        gw.log_text().matches("the store answers; serving").count(),
        1
    );
}

#[test]
fn with_wait_at_start_false_a_store_down_at_start_stops_the_gateway() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let up = rt.block_on(MockUpstream::start());
    let mut cfg = TestConfig::new(up.addr);
    cfg.postgres(&format!(
        "postgres://postgres@127.0.0.1:{}/postgres",
        free_port()
    ));
    cfg.set("store.wait_at_start", false);
    let path = cfg.write();
    let out = Command::new(env!("CARGO_BIN_EXE_mpg-gateway"))
        .args(["run", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success(), "it exited with {:?}", out.status);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("store"), "the error names the store: {err}");
}
