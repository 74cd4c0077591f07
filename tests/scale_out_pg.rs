//! Several gateway instances on one PostgreSQL store: changes made on
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
    // The change follower clears the cache when it starts; then B caches every key.
    tokio::time::sleep(Duration::from_millis(500)).await;

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

/// One request of the load: when it started (since the load began), how long it took, its status.
type Sample = (Duration, Duration, u16);

/// `tasks` clients, each on one keep-alive connection, cycling through `keys` on `gw`
/// until `stop` is set (at most `limit`); every request is recorded.
fn load(
    gw: &Gateway,
    keys: &[String],
    tasks: usize,
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
    limit: Duration,
) -> (Instant, Vec<tokio::task::JoinHandle<Vec<Sample>>>) {
    let began = Instant::now();
    let handles = (0..tasks)
        .map(|t| {
            let (url, keys, stop) = (gw.url(CLUSTERS), keys.to_vec(), stop.clone());
            tokio::spawn(async move {
                let http = client();
                let mut samples = Vec::new();
                let mut i = t;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) && began.elapsed() < limit {
                    let at = began.elapsed();
                    let status = match http
                        .get(&url)
                        .bearer_auth(&keys[i % keys.len()])
                        .send()
                        .await
                    {
                        Ok(res) => res.status().as_u16(),
                        Err(_) => 0,
                    };
                    samples.push((at, began.elapsed() - at, status));
                    i += 1;
                }
                samples
            })
        })
        .collect();
    (began, handles)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_refuses_connects_stalls_no_cached_key_and_is_found_again_at_once() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let db = PgDb::create().await;
    let proxy = TcpProxy::start(host_port(&db.url)).await;
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    cfg.postgres(&db.url);
    let direct = cfg.write_as("direct.toml");
    cfg.postgres(&via(&db.url, proxy.addr)).admin_on();
    // Entries come due every second; a lookup that waited on the store would wait 2 s.
    cfg.set("store.cache_ttl", "1s");
    cfg.set("store.stale_if_error", "60s");
    cfg.set("store.query_timeout", "2s");
    cfg.set("rate_limit.policies.default.requests", 1_000_000);
    cfg.set("rate_limit.policies.default.per", "1s");
    let path = cfg.write();
    let seed = seed(&direct, "acme", "alice", "owner", "clusters:read");
    let mut keys = vec![seed.key.clone()];
    keys.extend((0..3).map(|_| new_key(&direct, "alice").0));
    let (revoked, revoked_id) = new_key(&direct, "alice");
    let (unseen, _) = new_key(&direct, "alice");
    let gw = Gateway::start(&path);
    // The change follower clears the cache when it starts; then cache every key.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for key in keys.iter().chain([&revoked]) {
        assert_eq!(status_of(&gw, key).await, 200);
    }

    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let (began, tasks) = load(&gw, &keys, 2, &stop, Duration::from_secs(20));
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    proxy.set(ProxyMode::Refuse);
    let cut = began.elapsed();
    // Every cached entry comes due at least twice during the outage.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let started = Instant::now();
    let res = client()
        .get(gw.url(CLUSTERS))
        .bearer_auth(&unseen)
        .send()
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(res.status(), 503, "an unseen key during the outage");
    // Far under the 2 s a lookup that waited on the store would take.
    assert!(
        took < Duration::from_secs(1),
        "the unseen key's 503 took {took:?}"
    );
    let retry: u64 = res.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= 1);
    // Revoked while the gateway cannot hear it: served stale until the store is back.
    cli_ok(&direct, &["keys", "revoke", &revoked_id]);
    assert_eq!(status_of(&gw, &revoked).await, 200);
    proxy.set(ProxyMode::Open);
    let back = began.elapsed();
    let took = until_status(&gw, &unseen, 200, Duration::from_secs(5)).await;
    assert!(
        took.is_some_and(|t| t < Duration::from_secs(2)),
        "a key unseen during the outage was served {took:?} after the store came back"
    );
    let took = until_status(&gw, &revoked, 401, Duration::from_secs(5)).await;
    assert!(
        took.is_some_and(|t| t < Duration::from_secs(2)),
        "a revocation made during the outage applied {took:?} after the store came back"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::SeqCst);
    let mut samples = Vec::new();
    for task in tasks {
        samples.extend(task.await.unwrap());
    }

    let during: Vec<&Sample> = samples
        .iter()
        .filter(|(at, took, _)| *at + *took > cut && *at < back)
        .collect();
    assert!(
        during.len() >= 100,
        "only {} requests during the outage",
        during.len()
    );
    let slowest = during.iter().map(|(_, took, _)| *took).max().unwrap();
    eprintln!(
        "{} requests in all, {} during the outage, the slowest {slowest:?}",
        samples.len(),
        during.len()
    );
    // A cached key never waits on the store (2 s query timeout).
    assert!(
        slowest < Duration::from_secs(1),
        "a cached key waited {slowest:?} during the outage"
    );
    let failed: Vec<&Sample> = samples
        .iter()
        .filter(|(_, _, status)| *status != 200)
        .collect();
    assert!(failed.is_empty(), "cached keys refused: {failed:?}");

    // One opening, one closing, each logged once.
    let text = metrics(gw.admin.expect("admin listener")).await;
    for to in ["open", "closed"] {
        let label = format!("to=\"{to}\"");
        let n = metric_sum(&text, "mpg_store_breaker_transitions_total", &[&label]);
        assert_eq!(n, 1.0, "{to}: {text}");
    }
    assert_eq!(metric_sum(&text, "mpg_store_breaker_open", &[]), 0.0);
    let log = gw.log_text();
    assert_eq!(log.matches("key store circuit open").count(), 1, "{log}");
    assert_eq!(log.matches("circuit closed").count(), 1);
    assert!(!log.contains(&unseen) && !keys.iter().any(|k| log.contains(k.as_str())));
}

/// One number from the test database.
async fn scalar(url: &str, sql: &'static str) -> i64 {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    let n: i64 = sqlx::query_scalar(sql).fetch_one(&mut conn).await.unwrap();
    let _ = conn.close().await;
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_prunes_change_records_past_retention_and_keeps_recent_ones() {
    use sqlx::Connection;
    let db = PgDb::create().await;
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    cfg.postgres(&db.url).admin_on();
    let path = cfg.write();
    let seed = seed(&path, "acme", "alice", "owner", "clusters:read");
    let (old_key, old_id) = new_key(&path, "alice");
    let (new_key_, new_id) = new_key(&path, "alice");
    cli_ok(&path, &["keys", "revoke", &old_id]);
    // Everything logged so far (the role, the first revocation) is older than
    // the retention; the second revocation is recent.
    let old = scalar(&db.url, "SELECT MAX(seq) FROM changes").await;
    let retention = mpg_gateway::store::CHANGE_RETENTION.as_secs() as i64;
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("UPDATE changes SET at = $1 WHERE seq <= $2")
        .bind(unix_now() - retention - 60)
        .bind(old)
        .execute(&mut conn)
        .await
        .unwrap();
    let _ = conn.close().await;
    cli_ok(&path, &["keys", "revoke", &new_id]);
    let total = scalar(&db.url, "SELECT COUNT(*) FROM changes").await;
    assert!(total >= 3, "{total} change records");

    // The gateway prunes at start (then every minute).
    let gw = Gateway::start(&path);
    let took = within(Duration::from_secs(10), || async {
        scalar(&db.url, "SELECT COUNT(*) FROM changes").await == 1
    })
    .await;
    assert!(took.is_some(), "old change records were not pruned");
    assert_eq!(
        scalar(&db.url, "SELECT MIN(seq) FROM changes").await,
        old + 1,
        "the recent record was not kept"
    );
    assert_eq!(
        scalar(&db.url, "SELECT pruned_through FROM changes_horizon").await,
        old
    );
    // Counted once the prune run returns, just after its commit.
    let admin = gw.admin.expect("admin listener");
    let counted = within(Duration::from_secs(5), || async {
        let text = metrics(admin).await;
        metric_sum(&text, "mpg_store_changes_pruned_total", &[]) == (total - 1) as f64
    })
    .await;
    assert!(counted.is_some(), "{}", metrics(admin).await);
    // The gateway keeps working, and later changes still reach it.
    assert_eq!(status_of(&gw, &seed.key).await, 200);
    assert_eq!(status_of(&gw, &old_key).await, 401);
    assert_eq!(status_of(&gw, &new_key_).await, 401);
    cli_ok(&path, &["keys", "revoke", &seed.key_id]);
    assert!(
        until_status(&gw, &seed.key, 401, Duration::from_secs(5))
            .await
            .is_some(),
        "a revocation after pruning did not reach the gateway"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_whose_unread_change_records_were_pruned_drops_its_cache() {
    use mpg_gateway::store::{SqlStore, StoreConfig};
    let db = PgDb::create().await;
    let proxy = TcpProxy::start(host_port(&db.url)).await;
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    // The admin commands reach PostgreSQL directly; the gateway only through the proxy.
    cfg.postgres(&db.url);
    let direct = cfg.write_as("direct.toml");
    cfg.postgres(&via(&db.url, proxy.addr));
    cfg.set("store.cache_ttl", "1h");
    cfg.set("store.query_timeout", "500ms");
    let seed = seed(&direct, "acme", "alice", "owner", "clusters:read");
    let (other, _) = new_key(&direct, "alice");
    cfg.admin_on();
    let path = cfg.write();
    let gw = Gateway::start(&path);
    // Once the change follower has started (it clears the cache when it
    // does), both keys are cached: the second round is served from the cache.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for key in [&seed.key, &other] {
        assert_eq!(status_of(&gw, key).await, 200);
    }
    let hits = cache_hits(&gw).await;
    for key in [&seed.key, &other] {
        assert_eq!(status_of(&gw, key).await, 200);
    }
    assert!(cache_hits(&gw).await >= hits + 2.0, "keys not cached");

    // Cut off, the gateway misses a revocation whose record is then pruned
    // (as by another instance whose clock ran far ahead, or after an outage
    // longer than the retention): its change log cursor is below the horizon.
    proxy.set(ProxyMode::Cut);
    let cut = Instant::now();
    cli_ok(&direct, &["keys", "revoke", &seed.key_id]);
    let store = SqlStore::connect(&StoreConfig {
        url: db.url.clone(),
        query_timeout: Duration::from_secs(5),
    })
    .await
    .unwrap();
    let pruned = store.prune_changes(unix_now() + 1).await.unwrap();
    assert!(pruned >= 2, "{pruned} records pruned");
    assert_eq!(scalar(&db.url, "SELECT COUNT(*) FROM changes").await, 0);
    assert_eq!(
        status_of(&gw, &seed.key).await,
        200,
        "the cached entry is still served while cut off"
    );
    proxy.set(ProxyMode::Open);
    let cut = cut.elapsed();

    let took = until_status(&gw, &seed.key, 401, Duration::from_secs(5)).await;
    assert!(took.is_some(), "a pruned revocation was never applied");
    assert_eq!(status_of(&gw, &other).await, 200);
    let log = gw.log_text();
    assert!(
        log.contains("change log pruned past this gateway's position"),
        "the cache was not cleared for the pruned horizon"
    );
    let text = metrics(gw.admin.expect("admin listener")).await;
    assert_eq!(
        metric_sum(
            &text,
            "mpg_key_cache_clears_total",
            &["reason=\"change_log_pruned\""]
        ),
        1.0,
        "{text}"
    );
    // The cut was too short for the outage rule (5 s unread): the horizon
    // alone cleared the cache.
    assert!(
        cut < Duration::from_secs(4),
        "the cut lasted {cut:?}: too long to tell the horizon rule from the outage rule"
    );
    assert!(!log.contains("change log unread for a while"), "{cut:?}");
}
