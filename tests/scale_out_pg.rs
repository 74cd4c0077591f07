//! Several gateway instances on one PostgreSQL store (DESIGN.md §6, §8): changes made on
//! one instance, or by an admin command, reach another instance's cache within 1 s, and a
//! store outage (a TCP proxy between gateway and PostgreSQL that the test cuts) never
//! turns a valid key into a 401.
mod common;

use common::scale::*;
use common::*;
use std::time::{Duration, Instant};

const CLUSTERS: &str = "/api/v1/clusters?organization_id=acme";

async fn status_of(gw: &Gateway, key: &str) -> u16 {
    client()
        .get(gw.url(CLUSTERS))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// Waits (bounded) until `key` gets `want` on `gw`; returns how long that took.
async fn until_status(gw: &Gateway, key: &str, want: u16, limit: Duration) -> Option<Duration> {
    within(limit, || async { status_of(gw, key).await == want }).await
}

fn new_key(config: &std::path::Path, user: &str) -> (String, String) {
    create_key(config, "acme", user, "clusters:read")
}

/// Cache hits `gw` has counted so far.
async fn cache_hits(gw: &Gateway) -> f64 {
    let text = metrics(gw.admin.expect("admin listener")).await;
    metric_sum(&text, "mpg_key_cache_lookups_total", &["result=\"hit\""])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocation_deletion_and_role_changes_reach_the_other_instance_within_one_second() {
    let db = PgDb::create().await;
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    cfg.postgres(&db.url).admin_on();
    cfg.set("roles.auditor", vec!["api-keys:read".to_string()]);
    cfg.set("store.cache_ttl", "1h");
    let path = cfg.write();
    let seed = seed(&path, "acme", "alice", "owner", "clusters:read");
    let (key_cli, key_cli_id) = new_key(&path, "alice");
    let (key_del, key_del_id) = new_key(&path, "alice");
    cli_ok(&path, &["users", "create", "--id", "bob"]);
    cli_ok(
        &path,
        &[
            "members", "add", "--org", "acme", "--user", "bob", "--role", "member",
        ],
    );
    let (key_bob, _) = new_key(&path, "bob");
    let a = Gateway::start(&path);
    let b = Gateway::start(&path);

    // B caches every key: the second round is served from its cache.
    let keys = [&seed.key, &key_cli, &key_del, &key_bob];
    for key in keys {
        assert_eq!(status_of(&b, key).await, 200);
    }
    let hits = cache_hits(&b).await;
    for key in keys {
        assert_eq!(status_of(&b, key).await, 200);
    }
    assert!(
        cache_hits(&b).await >= hits + 4.0,
        "B did not serve the keys from its cache"
    );

    // Revoked through A's key service.
    let res = client()
        .post(a.url(&format!("/api/v1/api-keys/{}/revoke", seed.key_id)))
        .bearer_auth(&seed.session)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let took = until_status(&b, &seed.key, 401, Duration::from_secs(5)).await;
    assert!(
        took.is_some_and(|t| t < Duration::from_secs(1)),
        "revocation via A reached B after {took:?}"
    );

    // Deleted through A's key service.
    let res = client()
        .delete(a.url(&format!("/api/v1/api-keys/{key_del_id}")))
        .bearer_auth(&seed.session)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 204);
    let took = until_status(&b, &key_del, 401, Duration::from_secs(5)).await;
    assert!(
        took.is_some_and(|t| t < Duration::from_secs(1)),
        "deletion via A reached B after {took:?}"
    );

    // Revoked by the admin command (a separate process).
    cli_ok(&path, &["keys", "revoke", &key_cli_id]);
    let took = until_status(&b, &key_cli, 401, Duration::from_secs(5)).await;
    assert!(
        took.is_some_and(|t| t < Duration::from_secs(1)),
        "`keys revoke` reached B after {took:?}"
    );

    // Bob becomes an auditor (no clusters:read): his key keeps authenticating but is refused.
    cli_ok(
        &path,
        &[
            "members", "add", "--org", "acme", "--user", "bob", "--role", "auditor",
        ],
    );
    let took = until_status(&b, &key_bob, 403, Duration::from_secs(5)).await;
    assert!(
        took.is_some_and(|t| t < Duration::from_secs(1)),
        "role change reached B after {took:?}"
    );
    // A saw all of it too.
    assert_eq!(status_of(&a, &seed.key).await, 401);
    assert_eq!(status_of(&a, &key_bob).await, 403);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_serves_cached_keys_answers_503_and_recovers_without_restart() {
    let db = PgDb::create().await;
    let proxy = TcpProxy::start(host_port(&db.url)).await;
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    // The admin commands reach PostgreSQL directly; the gateway only through the proxy.
    cfg.postgres(&db.url);
    let direct = cfg.write_as("direct.toml");
    cfg.postgres(&via(&db.url, proxy.addr));
    cfg.set("store.cache_ttl", "1s");
    cfg.set("store.stale_if_error", "1m");
    cfg.set("store.query_timeout", "500ms");
    let path = cfg.write();
    let seed = seed(&direct, "acme", "alice", "owner", "clusters:read");
    let (uncached, _) = new_key(&direct, "alice");
    let (hung, _) = new_key(&direct, "alice");
    let gw = Gateway::start(&path);
    assert_eq!(status_of(&gw, &seed.key).await, 200);

    proxy.set(ProxyMode::Cut);
    // Past cache_ttl: the entry is stale, only stale_if_error keeps it.
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    for _ in 0..3 {
        assert_eq!(
            status_of(&gw, &seed.key).await,
            200,
            "stale entry not served"
        );
    }
    let res = client()
        .get(gw.url(CLUSTERS))
        .bearer_auth(&uncached)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 503, "an uncached valid key during an outage");
    let retry: u64 = res.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= 1);
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["error"], "ServiceUnavailable");

    // A store that accepts and never answers: the query times out, still 503.
    proxy.set(ProxyMode::Blackhole);
    let started = Instant::now();
    assert_eq!(status_of(&gw, &hung).await, 503);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(status_of(&gw, &seed.key).await, 200);

    // A change made while the gateway cannot hear it (its LISTEN connection is gone).
    proxy.set(ProxyMode::Cut);
    cli_ok(&direct, &["keys", "revoke", &seed.key_id]);
    proxy.set(ProxyMode::Open);
    let took = until_status(&gw, &seed.key, 401, Duration::from_secs(10)).await;
    assert!(
        took.is_some(),
        "revocation made during the outage never applied"
    );
    assert!(until_status(&gw, &uncached, 200, Duration::from_secs(10))
        .await
        .is_some());
    assert_eq!(status_of(&gw, &hung).await, 200);
    let log = gw.log_text();
    assert!(
        log.contains("change listener"),
        "the LISTEN connection's loss was not logged"
    );
    assert!(!log.contains(&seed.key) && !log.contains(&uncached));
}
