//! Per-key and per-organization limits against a real gateway: a key's own
//! limit (set by the CLI or the API) is its bucket and its
//! `X-RateLimit-Limit`, on the local and the Redis backend, and survives
//! rotation; an organization's override set by `orgs set-limit` reaches a
//! running gateway within a second, through the change log (not waiting for
//! `cache_ttl`), `orgs limits` lists it, and `orgs unset-limit` restores the
//! policy's quota. Bad input is refused naming the field.
mod common;

use common::scale::{redis_url, PgDb, RedisPrefix};
use common::*;
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

/// The shipped routes with a default policy of 100 per minute, keyed by
/// credential, and cached entries refreshed after a second.
fn config(up: &MockUpstream) -> TestConfig {
    let mut cfg = TestConfig::new(up.addr);
    cfg.set("rate_limit.policies.default.requests", 100);
    cfg.set("rate_limit.policies.default.per", "1m");
    cfg.set("store.cache_ttl", "1s");
    cfg
}

/// `orgs set-limit` for `org`'s override of `policy`.
fn set_limit_args<'a>(
    org: &'a str,
    policy: &'a str,
    requests: &'a str,
    per: &'a str,
) -> Vec<&'a str> {
    vec![
        "orgs",
        "set-limit",
        "--org",
        org,
        "--policy",
        policy,
        "--requests",
        requests,
        "--per",
        per,
    ]
}

/// `keys create` for alice in acme with `clusters:read`, then `extra`.
fn create_key_args<'a>(name: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "keys",
        "create",
        "--org",
        "acme",
        "--user",
        "alice",
        "--name",
        name,
        "--scopes",
        "clusters:read",
    ];
    args.extend_from_slice(extra);
    args
}

/// A limited key of alice in acme, made by `keys create --rate-limit`.
async fn limited_key(path: &Path, limit: &str) -> (String, Value) {
    let key = admin_ok(path, &create_key_args("own", &["--rate-limit", limit])).await;
    (key["key"].as_str().unwrap().to_owned(), key)
}

/// GET /clusters with `key`: (status, X-RateLimit-Limit, X-RateLimit-Remaining).
async fn clusters(gw: &Gateway, key: &str) -> (u16, Option<u32>, Option<u32>) {
    let res = client()
        .get(gw.url("/api/v1/clusters?organization_id=acme"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    let h = |name: &str| {
        res.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
    };
    (
        res.status().as_u16(),
        h("x-ratelimit-limit"),
        h("x-ratelimit-remaining"),
    )
}

/// GET /api-keys with a session: (status, X-RateLimit-Limit).
async fn list_keys(gw: &Gateway, session: &str) -> (u16, Option<u32>) {
    let res = client()
        .get(gw.url("/api/v1/api-keys?organization_id=acme"))
        .bearer_auth(session)
        .send()
        .await
        .unwrap();
    let limit = res
        .headers()
        .get("x-ratelimit-limit")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    (res.status().as_u16(), limit)
}

async fn own_limit_counts_alone(gw: &Gateway, path: &Path, other_key: &str) {
    let (key, record) = limited_key(path, "3/1m").await;
    assert_eq!(record["rate_limit"], json!({"requests": 3, "per": "1m"}));
    for remaining in [2, 1, 0] {
        assert_eq!(clusters(gw, &key).await, (200, Some(3), Some(remaining)));
    }
    let (status, limit, _) = clusters(gw, &key).await;
    assert_eq!((status, limit), (429, Some(3)));
    // Another key of the same user keeps the policy's quota and bucket.
    assert_eq!(clusters(gw, other_key).await, (200, Some(100), Some(99)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_own_limit_is_its_bucket_and_its_header() {
    let up = MockUpstream::start().await;
    let cfg = config(&up);
    let path = cfg.write();
    let seed = seed(&path, "acme", "alice", "owner", "clusters:read");
    let gw = Gateway::start(&path);
    own_limit_counts_alone(&gw, &path, &seed.key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_own_limit_is_shared_through_redis() {
    let prefix = RedisPrefix::new();
    let up = MockUpstream::start().await;
    let mut cfg = config(&up);
    cfg.redis(&redis_url(), &prefix.0);
    // Generous on a busy machine: a timed-out call would count in-process.
    cfg.set("rate_limit.redis_timeout", "2s");
    let path = cfg.write();
    let seed = seed(&path, "acme", "alice", "owner", "clusters:read");
    let (a, b) = (Gateway::start(&path), Gateway::start(&path));
    let (key, _) = limited_key(&path, "2/1m").await;
    assert_eq!(clusters(&a, &key).await, (200, Some(2), Some(1)));
    assert_eq!(clusters(&b, &key).await, (200, Some(2), Some(0)));
    assert_eq!(clusters(&a, &key).await.0, 429);
    assert_eq!(clusters(&b, &key).await.0, 429);
    assert_eq!(clusters(&b, &seed.key).await, (200, Some(100), Some(99)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_creates_shows_and_rotates_a_keys_own_limit() {
    let up = MockUpstream::start().await;
    let cfg = config(&up);
    let path = cfg.write();
    let seed = seed(&path, "acme", "alice", "owner", "clusters:read");
    let gw = Gateway::start(&path);
    let post = |body: Value| {
        client()
            .post(gw.url("/api/v1/api-keys?organization_id=acme"))
            .bearer_auth(&seed.session)
            .json(&body)
            .send()
    };
    let res = post(json!({
        "name": "ci", "scopes": ["clusters:read"],
        "rate_limit": {"requests": 2, "per": "30s"}
    }))
    .await
    .unwrap();
    assert_eq!(res.status(), 201);
    let created: Value = res.json().await.unwrap();
    assert_eq!(created["rate_limit"], json!({"requests": 2, "per": "30s"}));
    let key = created["key"].as_str().unwrap();
    assert_eq!(clusters(&gw, key).await, (200, Some(2), Some(1)));
    let id = created["id"].as_str().unwrap();
    let got: Value = client()
        .get(gw.url(&format!("/api/v1/api-keys/{id}")))
        .bearer_auth(&seed.session)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(got["rate_limit"], created["rate_limit"]);
    let listed: Value = client()
        .get(gw.url("/api/v1/api-keys?organization_id=acme"))
        .bearer_auth(&seed.session)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let shown: Vec<&Value> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| &k["rate_limit"])
        .collect();
    assert!(shown.contains(&&Value::Null), "{listed}");
    assert!(shown.contains(&&created["rate_limit"]), "{listed}");
    let rotated: Value = client()
        .post(gw.url(&format!("/api/v1/api-keys/{id}/rotate")))
        .bearer_auth(&seed.session)
        .json(&json!({"grace_period_seconds": 60}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(rotated["rate_limit"], created["rate_limit"]);
    let new_key = rotated["key"].as_str().unwrap();
    assert_eq!(clusters(&gw, new_key).await, (200, Some(2), Some(1)));

    for (body, field) in [
        (json!({"requests": 0, "per": "1m"}), "rate_limit.requests"),
        (json!({"requests": 10}), "rate_limit.per"),
        (json!({"requests": 10, "per": "soon"}), "rate_limit.per"),
        (
            json!({"requests": 10, "per": "1m", "burst": 1}),
            "rate_limit.burst",
        ),
        (json!("10/1m"), "rate_limit"),
    ] {
        let res = post(json!({"name": "x", "scopes": ["clusters:read"], "rate_limit": body}))
            .await
            .unwrap();
        assert_eq!(res.status(), 400, "{body}");
        let err: Value = res.json().await.unwrap();
        assert_eq!(err["details"]["field"], field, "{err}");
        assert!(err["message"].as_str().unwrap().contains(field), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_org_override_reaches_a_running_gateway_on_sqlite() {
    org_override(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_org_override_reaches_a_running_gateway_on_postgres() {
    org_override(true).await;
}

/// Polls `probe` until it gives `want`, for at most a second.
async fn eventually<F, Fut, T>(want: T, mut probe: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = T>,
    T: PartialEq + std::fmt::Debug,
{
    let started = Instant::now();
    loop {
        let got = probe().await;
        if got == want {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "still {got:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn org_override(pg: bool) {
    let up = MockUpstream::start().await;
    let mut cfg = config(&up);
    // Cached for an hour: only the change log can tell the gateway.
    cfg.set("store.cache_ttl", "1h");
    let _db = if pg {
        let db = PgDb::create().await;
        cfg.postgres(&db.url);
        Some(db)
    } else {
        None
    };
    let path = cfg.write();
    let seed = seed(&path, "acme", "alice", "owner", "clusters:read");
    let gw = Gateway::start(&path);
    assert_eq!(clusters(&gw, &seed.key).await.1, Some(100));
    assert_eq!(list_keys(&gw, &seed.session).await, (200, Some(100)));

    let set = admin_ok(&path, &set_limit_args("acme", "default", "1000", "1m")).await;
    assert_eq!(
        set,
        json!({"organization_id": "acme", "policy": "default", "requests": 1000, "per": "1m"})
    );
    eventually(Some(1000), || async { clusters(&gw, &seed.key).await.1 }).await;
    let listed = admin_ok(&path, &["orgs", "limits", "--org", "acme"]).await;
    assert_eq!(listed["data"], json!([set]), "{listed}");
    let (code, _, err) = admin(&path, &["orgs", "limits", "--org", "nope"]).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no organization with id \"nope\""), "{err}");
    // A session acting for acme gets it too.
    eventually((200, Some(1000)), || list_keys(&gw, &seed.session)).await;

    admin_ok(&path, &set_limit_args("acme", "default", "2", "1h")).await;
    let made = admin_ok(&path, &create_key_args("fresh", &[])).await;
    let key = made["key"].as_str().unwrap();
    assert_eq!(clusters(&gw, key).await, (200, Some(2), Some(1)));
    assert_eq!(clusters(&gw, key).await, (200, Some(2), Some(0)));
    assert_eq!(clusters(&gw, key).await.0, 429);

    let unset = admin_ok(
        &path,
        &[
            "orgs",
            "unset-limit",
            "--org",
            "acme",
            "--policy",
            "default",
        ],
    )
    .await;
    assert_eq!(unset["removed"], true);
    eventually(Some(100), || async { clusters(&gw, key).await.1 }).await;
    // A key's own limit wins over its organization's override.
    admin_ok(&path, &set_limit_args("acme", "default", "50", "1m")).await;
    let (own, _) = limited_key(&path, "5/1m").await;
    assert_eq!(clusters(&gw, &own).await.1, Some(5));
}

#[tokio::test]
async fn limit_commands_refuse_bad_input_naming_it() {
    let up = MockUpstream::start().await;
    let cfg = config(&up);
    let path = cfg.write();
    seed(&path, "acme", "alice", "owner", "clusters:read");
    for (org, policy, requests, per, says) in [
        ("acme", "gold", "10", "1m", "unknown policy \"gold\""),
        ("acme", "default", "0", "1m", "--requests"),
        ("acme", "default", "10", "1 minute", "--per"),
        ("acme", "default", "10", "0s", "--per"),
        (
            "ghost",
            "default",
            "1",
            "1s",
            "organization ghost not found",
        ),
    ] {
        refused(&path, &set_limit_args(org, policy, requests, per), says).await;
    }
    refused(
        &path,
        &[
            "orgs",
            "unset-limit",
            "--org",
            "acme",
            "--policy",
            "default",
        ],
        "no limit of its own",
    )
    .await;
    refused(
        &path,
        &["orgs", "unset-limit", "--org", "acme", "--policy", "gold"],
        "unknown policy \"gold\"",
    )
    .await;
    for bad in ["10", "0/1m", "x/1m", "10/forever", "10/0s"] {
        refused(
            &path,
            &create_key_args("k", &["--rate-limit", bad]),
            "--rate-limit",
        )
        .await;
    }
}
