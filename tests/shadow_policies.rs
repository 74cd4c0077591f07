//! A rate-limit policy with `mode = "shadow"`: it counts and answers with
//! the rate-limit headers as an enforcing one does, but lets through what it
//! would refuse, counting each such request in
//! `mpg_ratelimit_shadow_refusals_total` and marking it in the access log;
//! on the local and on the Redis backend.
mod common;

use common::scale::*;
use common::*;
use serde_json::Value;
use std::time::Duration;

const CLUSTERS: &str = "/api/v1/clusters?organization_id=acme";
/// The bucket of the shadow policy.
const LIMIT: usize = 3;
/// Requests past it.
const OVER: usize = 4;

/// The shipped routes with `default` a shadow policy of [`LIMIT`] a minute,
/// the admin listener on, and `/api/v1/strict` under an enforcing policy of
/// the same size.
fn config(up: &MockUpstream) -> TestConfig {
    let mut cfg = TestConfig::new(up.addr);
    cfg.admin_on();
    cfg.set("rate_limit.policies.default.requests", LIMIT as i64);
    cfg.set("rate_limit.policies.default.per", "1m");
    cfg.set("rate_limit.policies.default.mode", "shadow");
    cfg.set("rate_limit.policies.strict.requests", LIMIT as i64);
    cfg.set("rate_limit.policies.strict.per", "1m");
    cfg.route("method = \"GET\"\npath = \"/api/v1/strict\"\nauth = \"api_key\"\nscope = \"clusters:read\"\norganization = \"query:organization_id\"\nupstream = \"clusters\"\nrate_limit = \"strict\"");
    cfg
}

/// The access-log line of request `id` (waits for it).
async fn access_line(gw: &Gateway, id: &str) -> Value {
    for _ in 0..250 {
        let found = gw.log.lock().unwrap().iter().find_map(|line| {
            let v: Value = serde_json::from_str(line).ok()?;
            (v["message"] == "request" && v["request_id"] == id).then_some(v)
        });
        if let Some(v) = found {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no access-log line for request {id}:\n{}", gw.log_text());
}

/// [`LIMIT`] + [`OVER`] requests through the shadow policy, then through the
/// enforcing one; checks what the client, the upstream, `/metrics` and the
/// access log see.
/// Returns the gateway's log.
async fn shadow_lets_through_what_it_counts(cfg: TestConfig, up: &MockUpstream) -> String {
    let path = cfg.write();
    let (key, _) = seed_key(&path);
    let gw = Gateway::start(&path);
    let c = client();

    let mut resets = Vec::new();
    for i in 0..LIMIT + OVER {
        let id = format!("shadow-{i}");
        let res = c
            .get(gw.url(CLUSTERS))
            .bearer_auth(&key)
            .header("x-request-id", &id)
            .send()
            .await
            .unwrap();
        let h = res.headers();
        assert_eq!(res.status(), 200, "request {i} was refused");
        assert_eq!(h["x-ratelimit-limit"], LIMIT.to_string());
        let remaining = LIMIT.saturating_sub(i + 1).to_string();
        assert_eq!(
            h["x-ratelimit-remaining"],
            remaining.as_str(),
            "request {i}"
        );
        assert!(!h.contains_key("retry-after"), "request {i}: {h:?}");
        resets.push(h["x-ratelimit-reset"].to_str().unwrap().to_string());
        let line = access_line(&gw, &id).await;
        assert_eq!(line["status"], 200);
        if i < LIMIT {
            // Like every field a request has not got: null.
            assert!(line["shadow_limited"].is_null(), "{line}");
        } else {
            assert_eq!(line["shadow_limited"], true, "{line}");
        }
    }
    assert_eq!(
        up.count(),
        LIMIT + OVER,
        "every request reached the upstream"
    );
    // A request the shadow policy would refuse takes no token: the bucket is
    // full again when it would have been anyway.
    let last_allowed = &resets[LIMIT - 1];
    assert!(
        resets[LIMIT..].iter().all(|r| r == last_allowed),
        "{resets:?}"
    );

    // The same quota, enforced, on another route.
    for i in 0..=LIMIT {
        let res = c
            .get(gw.url("/api/v1/strict?organization_id=acme"))
            .bearer_auth(&key)
            .header("x-request-id", format!("strict-{i}"))
            .send()
            .await
            .unwrap();
        let want = if i < LIMIT { 200 } else { 429 };
        assert_eq!(res.status(), want, "strict request {i}");
    }
    let line = access_line(&gw, &format!("strict-{LIMIT}")).await;
    assert!(line["shadow_limited"].is_null(), "{line}");

    let text = metrics(gw.admin.expect("admin listener")).await;
    let shadow = "mpg_ratelimit_shadow_refusals_total";
    assert_eq!(
        metric_sum(&text, shadow, &["policy=\"default\""]),
        OVER as f64,
        "{text}"
    );
    assert_eq!(
        metric_sum(&text, shadow, &["policy=\"strict\""]),
        0.0,
        "{text}"
    );
    let requests = "mpg_requests_total";
    let route = "route=\"/api/v1/clusters\"";
    assert_eq!(
        metric_sum(&text, requests, &[route, "status=\"200\""]),
        (LIMIT + OVER) as f64,
        "{text}"
    );
    assert_eq!(
        metric_sum(&text, requests, &[route, "status=\"429\""]),
        0.0,
        "{text}"
    );
    let strict = "route=\"/api/v1/strict\"";
    assert_eq!(
        metric_sum(&text, requests, &[strict, "status=\"429\""]),
        1.0,
        "{text}"
    );
    gw.log_text()
}

/// An API key of alice in acme with `clusters:read` (and the seeded org).
fn seed_key(path: &std::path::Path) -> (String, String) {
    let s = seed(path, "acme", "alice", "owner", "clusters:read");
    (s.key, s.key_id)
}

#[tokio::test]
async fn a_shadow_policy_never_refuses_on_the_local_backend() {
    let up = MockUpstream::start().await;
    let cfg = config(&up);
    let _ = shadow_lets_through_what_it_counts(cfg, &up).await;
}

#[tokio::test]
async fn a_shadow_policy_never_refuses_on_the_redis_backend() {
    let up = MockUpstream::start().await;
    let prefix = RedisPrefix::new();
    let mut cfg = config(&up);
    cfg.redis(&redis_url(), &prefix.0);
    // A failing Redis must not pass for one: no fallback to the local backend.
    cfg.set("rate_limit.on_backend_error", "deny");
    let log = shadow_lets_through_what_it_counts(cfg, &up).await;
    assert!(!prefix.keys().is_empty(), "no bucket in Redis");
    assert!(!log.contains("rate-limit backend redis"), "{log}");
}

#[tokio::test]
async fn a_mode_other_than_enforce_or_shadow_is_refused_by_check_config() {
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    cfg.set("rate_limit.policies.default.mode", "dry-run");
    let (code, _, err) = cli(&cfg.write(), &["check-config"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("rate_limit.policies.default.mode"),
        "stderr: {err}"
    );
}
