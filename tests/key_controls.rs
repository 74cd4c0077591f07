//! A key's controls against a real gateway and upstream: credits spent
//! exactly and refused at zero with their reason, `X-Credits-Remaining` on
//! every answer, the route's `cost`, the count kept across a stop; a key
//! disabled and enabled again by `PATCH`; an allow-list read behind a
//! trusted proxy; bad input refused by field with nothing changed. On
//! PostgreSQL and Redis, two instances: exactly the credits a key has under
//! concurrent load on both, one refill when both cross a boundary, and a
//! `PATCH` on one seen by the other within a second; while Redis is down,
//! credits spent as `on_backend_error` says (`local`: each instance its
//! share of the last count it saw).
mod common;

use common::scale::{redis_url, within, PgDb, RedisPrefix};
use common::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const CLUSTERS: &str = "/api/v1/clusters?organization_id=acme";

/// The shipped routes with a roomy policy, a route `/api/v1/bulk` that
/// costs 5 credits, and cached entries refreshed after a second.
fn config(up: &MockUpstream) -> TestConfig {
    let mut cfg = TestConfig::new(up.addr);
    cfg.set("rate_limit.policies.default.requests", 10_000);
    cfg.set("rate_limit.policies.default.per", "1m");
    cfg.set("store.cache_ttl", "1s");
    cfg.route("method = \"GET\"\npath = \"/api/v1/bulk\"\nauth = \"api_key\"\nscope = \"clusters:read\"\norganization = \"query:organization_id\"\nupstream = \"clusters\"\nrate_limit = \"default\"\ncost = 5");
    cfg
}

/// acme, its owner alice and her session.
fn owner_session(path: &Path) -> String {
    seed(path, "acme", "alice", "owner", "clusters:read").session
}

/// Creates a key through the API with `extra` fields: (secret, record).
async fn create(gw: &Gateway, session: &str, extra: Value) -> (String, Value) {
    let mut body = json!({"name": "controlled", "scopes": ["clusters:read"]});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let res = client()
        .post(gw.url("/api/v1/api-keys?organization_id=acme"))
        .bearer_auth(session)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = res.status();
    let record: Value = res.json().await.unwrap();
    assert_eq!(status, 201, "{record}");
    (record["key"].as_str().unwrap().to_owned(), record)
}

/// `PATCH /api/v1/api-keys/{id}` with `body`: (status, JSON answer).
async fn patch(gw: &Gateway, session: &str, id: &str, body: Value) -> (u16, Value) {
    let res = client()
        .patch(gw.url(&format!("/api/v1/api-keys/{id}")))
        .bearer_auth(session)
        .json(&body)
        .send()
        .await
        .unwrap();
    (res.status().as_u16(), res.json().await.unwrap())
}

/// The key's record through the API.
async fn record(gw: &Gateway, session: &str, id: &str) -> Value {
    let res = client()
        .get(gw.url(&format!("/api/v1/api-keys/{id}")))
        .bearer_auth(session)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    res.json().await.unwrap()
}

/// One keyed request: status, `X-Credits-Remaining`, `Retry-After`, body.
#[derive(Debug)]
struct Answer {
    status: u16,
    credits: Option<u64>,
    retry_after: Option<String>,
    body: Value,
}

async fn call(gw: &Gateway, target: &str, key: &str, forwarded_for: Option<&str>) -> Answer {
    let mut req = client().get(gw.url(target)).bearer_auth(key);
    if let Some(ip) = forwarded_for {
        req = req.header("x-forwarded-for", ip);
    }
    let res = req.send().await.unwrap();
    let header = |name: &str| {
        res.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let credits = header("x-credits-remaining").map(|v| v.parse().unwrap());
    let retry_after = header("retry-after");
    Answer {
        status: res.status().as_u16(),
        credits,
        retry_after,
        body: res.json().await.unwrap_or(Value::Null),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credits_are_spent_exactly_refused_at_zero_and_kept_across_a_stop() {
    let up = MockUpstream::start().await;
    let cfg = config(&up);
    let path = cfg.write();
    let session = owner_session(&path);
    let mut gw = Gateway::start(&path);
    let (key, rec) = create(&gw, &session, json!({"credits": {"remaining": 8}})).await;
    assert_eq!(rec["credits"], json!({"remaining": 8, "refill": null}));
    let id = rec["id"].as_str().unwrap().to_owned();
    for left in [7, 6] {
        let a = call(&gw, CLUSTERS, &key, None).await;
        assert_eq!((a.status, a.credits), (200, Some(left)), "{a:?}");
    }
    // The route's cost: 5 at once.
    let a = call(&gw, "/api/v1/bulk?organization_id=acme", &key, None).await;
    assert_eq!((a.status, a.credits), (200, Some(1)));
    // Too few for the route's cost: refused, nothing spent.
    let a = call(&gw, "/api/v1/bulk?organization_id=acme", &key, None).await;
    assert_eq!((a.status, a.credits), (429, Some(1)), "{a:?}");
    assert_eq!(a.body["details"]["reason"], "credits_exhausted");
    assert_eq!(a.retry_after, None, "no refill, no Retry-After");
    assert_eq!(up.count(), 3);
    let a = call(&gw, CLUSTERS, &key, None).await;
    assert_eq!((a.status, a.credits), (200, Some(0)));
    let a = call(&gw, CLUSTERS, &key, None).await;
    assert_eq!((a.status, a.credits), (429, Some(0)));
    // Set again: spent from the new count at once.
    let (status, body) = patch(&gw, &session, &id, json!({"credits": {"remaining": 3}})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["credits"]["remaining"], 3);
    // Spent with the rate limit, and given back when a later stage refuses
    // (another organization): the count shows, whole.
    let a = call(&gw, "/api/v1/clusters?organization_id=other", &key, None).await;
    assert_eq!((a.status, a.credits), (404, Some(3)));
    let a = call(&gw, CLUSTERS, &key, None).await;
    assert_eq!((a.status, a.credits), (200, Some(2)));
    // Written to the store within a second, and on a stop.
    let shown = within(Duration::from_secs(3), || async {
        record(&gw, &session, &id).await["credits"]["remaining"] == 2
    })
    .await;
    assert!(shown.is_some(), "the store's count never followed");
    let a = call(&gw, CLUSTERS, &key, None).await;
    assert_eq!(a.credits, Some(1));
    assert!(gw.terminate().success());
    let gw = Gateway::start(&path);
    let a = call(&gw, CLUSTERS, &key, None).await;
    assert_eq!(
        (a.status, a.credits),
        (200, Some(0)),
        "given back at the stop"
    );
    // Without credits: no header at all.
    let (plain, _) = create(&gw, &session, json!({})).await;
    assert_eq!(call(&gw, CLUSTERS, &plain, None).await.credits, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disabled_key_is_refused_and_works_again_once_enabled() {
    let up = MockUpstream::start().await;
    let cfg = config(&up);
    let path = cfg.write();
    let session = owner_session(&path);
    let gw = Gateway::start(&path);
    let (key, rec) = create(&gw, &session, json!({})).await;
    let id = rec["id"].as_str().unwrap();
    assert_eq!(rec["enabled"], true);
    assert_eq!(call(&gw, CLUSTERS, &key, None).await.status, 200);
    let (status, body) = patch(&gw, &session, id, json!({"enabled": false})).await;
    assert_eq!((status, &body["enabled"]), (200, &json!(false)), "{body}");
    let a = call(&gw, CLUSTERS, &key, None).await;
    assert_eq!(a.status, 401);
    assert_eq!(a.body["details"]["reason"], "disabled");
    let (status, body) = patch(&gw, &session, id, json!({"enabled": true, "name": "back"})).await;
    assert_eq!((status, &body["name"]), (200, &json!("back")));
    assert_eq!(call(&gw, CLUSTERS, &key, None).await.status, 200);
    // Each change is audited by field name, never by value.
    let res = client()
        .get(gw.url("/api/v1/audit-events?organization_id=acme"))
        .bearer_auth(&session)
        .send()
        .await
        .unwrap();
    let events: Value = res.json().await.unwrap();
    let updates: Vec<&Value> = events["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "api_key.updated")
        .collect();
    assert_eq!(updates.len(), 2, "{events}");
    assert_eq!(updates[0]["fields"], json!(["name", "enabled"]));
    assert_eq!(updates[1]["fields"], json!(["enabled"]));
    assert_eq!(updates[0]["key_id"], id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_allow_list_reads_the_client_behind_a_trusted_proxy() {
    let up = MockUpstream::start().await;
    let mut cfg = config(&up);
    cfg.set("server.client_ip.trusted_proxies", vec!["127.0.0.1/32"]);
    let path = cfg.write();
    let session = owner_session(&path);
    let gw = Gateway::start(&path);
    let allow = json!({"ip_allow": ["203.0.113.0/24", "2001:db8::/32"]});
    let (key, rec) = create(&gw, &session, allow).await;
    assert_eq!(rec["ip_allow"], json!(["203.0.113.0/24", "2001:db8::/32"]));
    for (client, status) in [
        ("203.0.113.9", 200),
        ("::ffff:203.0.113.9", 200),
        ("2001:db8::7", 200),
        ("198.51.100.1", 403),
        ("203.0.114.1", 403),
    ] {
        let a = call(&gw, CLUSTERS, &key, Some(client)).await;
        assert_eq!(a.status, status, "{client}: {a:?}");
        if status == 403 {
            assert_eq!(a.body["details"]["reason"], "ip_not_allowed", "{client}");
        }
    }
    // The proxy itself (127.0.0.1) is no client of the list.
    assert_eq!(call(&gw, CLUSTERS, &key, None).await.status, 403);
    assert_eq!(up.count(), 3);
    // Cleared: from anywhere.
    let id = rec["id"].as_str().unwrap();
    let (status, _) = patch(&gw, &session, id, json!({"ip_allow": null})).await;
    assert_eq!(status, 200);
    assert_eq!(call(&gw, CLUSTERS, &key, None).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_by_field_and_changes_nothing() {
    let up = MockUpstream::start().await;
    let cfg = config(&up);
    let path = cfg.write();
    let session = owner_session(&path);
    let gw = Gateway::start(&path);
    let (_, rec) = create(&gw, &session, json!({"credits": {"remaining": 5}})).await;
    let id = rec["id"].as_str().unwrap().to_owned();
    let big = "x".repeat(4100);
    for (body, field) in [
        (json!({"ip_allow": ["10.0.0.1/8"]}), "ip_allow"),
        (json!({"ip_allow": "10.0.0.0/8"}), "ip_allow"),
        (json!({"meta": {"blob": big}}), "meta"),
        (json!({"meta": [1, 2]}), "meta"),
        (json!({"credits": {"remaining": -1}}), "credits.remaining"),
        (
            json!({"credits": {"refill": {"amount": 10, "interval": "30s"}}}),
            "credits.refill.interval",
        ),
        (
            json!({"credits": {"refill": {"amount": -5, "interval": "1d"}}}),
            "credits.refill.amount",
        ),
        (json!({"enabled": "no"}), "enabled"),
        (json!({"scopes": ["clusters:write"]}), "scopes"),
        (json!({"id": "key_other"}), "id"),
        (json!({"organization_id": "other"}), "organization_id"),
        (json!({"colour": "red"}), "colour"),
        (json!({}), "body"),
        (json!({"enabled": false, "meta": 7}), "meta"),
    ] {
        let (status, answer) = patch(&gw, &session, &id, body.clone()).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert_eq!(answer["details"]["field"], field, "{body}: {answer}");
    }
    let after = record(&gw, &session, &id).await;
    for field in ["enabled", "ip_allow", "meta", "credits", "name", "scopes"] {
        assert_eq!(after[field], rec[field], "{field} changed");
    }
    // The same checks on create.
    let res = client()
        .post(gw.url("/api/v1/api-keys?organization_id=acme"))
        .bearer_auth(&session)
        .json(&json!({"name": "n", "scopes": ["clusters:read"], "ip_allow": ["192.0.2.1/24"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
    let answer: Value = res.json().await.unwrap();
    assert_eq!(answer["details"]["field"], "ip_allow");
    // A revoked key cannot change.
    let res = client()
        .post(gw.url(&format!("/api/v1/api-keys/{id}/revoke")))
        .bearer_auth(&session)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let (status, answer) = patch(&gw, &session, &id, json!({"enabled": false})).await;
    assert_eq!((status, &answer["details"]["field"]), (400, &json!("id")));
    assert_eq!(record(&gw, &session, &id).await["enabled"], true);
}

/// Two gateways on one PostgreSQL store and one Redis prefix.
struct Pair {
    a: Gateway,
    b: Gateway,
    path: PathBuf,
    _up: MockUpstream,
    _db: PgDb,
    _prefix: RedisPrefix,
    _cfg: TestConfig,
}

async fn pair() -> Pair {
    let up = MockUpstream::start().await;
    let db = PgDb::create().await;
    let prefix = RedisPrefix::new();
    let mut cfg = config(&up);
    cfg.postgres(&db.url);
    cfg.redis(&redis_url(), &prefix.0);
    let path = cfg.write();
    let a = Gateway::start(&path);
    let b = Gateway::start(&path);
    Pair {
        a,
        b,
        path,
        _up: up,
        _db: db,
        _prefix: prefix,
        _cfg: cfg,
    }
}

/// Requests by `clients` concurrent clients, every other one on each
/// instance, `each` requests apiece with `key`: how many were let through
/// (any answer but 200 or 429 fails the test).
async fn admitted(p: &Pair, key: &str, clients: usize, each: usize) -> usize {
    let mut tasks = Vec::new();
    for i in 0..clients {
        let gw = if i % 2 == 0 { &p.a } else { &p.b };
        let (url, key) = (gw.url(CLUSTERS), key.to_owned());
        tasks.push(tokio::spawn(async move {
            let c = client();
            let mut ok = 0;
            for _ in 0..each {
                let res = c.get(&url).bearer_auth(&key).send().await.unwrap();
                match res.status().as_u16() {
                    200 => ok += 1,
                    429 => {}
                    other => panic!("{other}"),
                }
            }
            ok
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.unwrap();
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_redis_admit_exactly_the_credits_a_key_has() {
    let p = pair().await;
    let session = owner_session(&p.path);
    let (key, rec) = create(&p.a, &session, json!({"credits": {"remaining": 100}})).await;
    let id = rec["id"].as_str().unwrap().to_owned();
    // Spent with the token in Redis, and given back there when authorization refuses.
    let a = call(&p.b, "/api/v1/clusters?organization_id=other", &key, None).await;
    assert_eq!((a.status, a.credits), (404, Some(100)));
    // 8 clients, 4 on each instance, 40 requests each: 320 asks for 100.
    let admitted = admitted(&p, &key, 8, 40).await;
    assert_eq!(admitted, 100);
    // The store's copy follows within a few seconds, for display.
    let shown = within(Duration::from_secs(6), || async {
        record(&p.b, &session, &id).await["credits"]["remaining"] == 0
    })
    .await;
    assert!(shown.is_some(), "the store's count never reached 0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refill_crossed_by_both_instances_at_once_happens_once() {
    let p = pair().await;
    let session = owner_session(&p.path);
    let credits = json!({"credits": {"remaining": 1, "refill": {"amount": 6, "interval": "1m"}}});
    let (key, rec) = create(&p.a, &session, credits).await;
    let id = rec["id"].as_str().unwrap().to_owned();
    assert_eq!(call(&p.a, CLUSTERS, &key, None).await.credits, Some(0));
    let a = call(&p.b, CLUSTERS, &key, None).await;
    assert_eq!((a.status, a.credits), (429, Some(0)));
    let wait: u64 = a.retry_after.unwrap().parse().unwrap();
    assert!((1..=60).contains(&wait), "{wait}");
    // Move the key's creation back so that the boundary is two seconds away.
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&p._db.url)
        .await
        .unwrap();
    sqlx::query("UPDATE api_keys SET created_at = $2 WHERE id = $1")
        .bind(&id)
        .bind(unix_now() - 58)
        .execute(&mut conn)
        .await
        .unwrap();
    // Both caches take the new time (cache_ttl is 1 s), then the boundary passes.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let admitted = admitted(&p, &key, 10, 1).await;
    assert_eq!(admitted, 6, "one refill of 6, not one per instance");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_patch_on_one_instance_is_seen_by_the_other_within_a_second() {
    let p = pair().await;
    let session = owner_session(&p.path);
    let (key, rec) = create(&p.a, &session, json!({})).await;
    let id = rec["id"].as_str().unwrap().to_owned();
    // Cached on b first.
    assert_eq!(call(&p.b, CLUSTERS, &key, None).await.status, 200);
    let (status, _) = patch(&p.a, &session, &id, json!({"enabled": false})).await;
    assert_eq!(status, 200);
    let started = Instant::now();
    let seen = within(Duration::from_secs(2), || async {
        call(&p.b, CLUSTERS, &key, None).await.status == 401
    })
    .await;
    assert!(
        seen.is_some_and(|t| t <= Duration::from_millis(1100)),
        "{:?}",
        started.elapsed()
    );
    let (status, _) = patch(&p.a, &session, &id, json!({"enabled": true})).await;
    assert_eq!(status, 200);
    let seen = within(Duration::from_secs(2), || async {
        call(&p.b, CLUSTERS, &key, None).await.status == 200
    })
    .await;
    assert!(seen.is_some_and(|t| t <= Duration::from_millis(1100)));
}

/// The instances sharing `gw`'s Redis, as its `/readyz` reports them.
async fn instances(gw: &Gateway) -> u64 {
    readyz(gw).await["rate_limiter"]["instances"]
        .as_u64()
        .unwrap()
}

/// Waits until every one of `gws` counts `n` instances on its Redis.
async fn until_counted(gws: &[&Gateway], n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    for gw in gws {
        while instances(gw).await != n {
            assert!(Instant::now() < deadline, "{n} instances never counted");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_redis_is_down_credits_are_spent_as_on_backend_error_says() {
    use common::scale::{host_port, via, ProxyMode, TcpProxy};
    let prefix = RedisPrefix::new();
    let proxy = TcpProxy::start(host_port(&redis_url())).await;
    let up = MockUpstream::start().await;
    let mut cfg = config(&up);
    cfg.set("rate_limit.redis_timeout", "200ms");
    cfg.set("admin.enabled", true);
    cfg.set("admin.listen", "127.0.0.1:0");
    cfg.redis(&via(&redis_url(), proxy.addr), &prefix.0);
    let mut gws = Vec::new();
    let mut session = None;
    for mode in ["local", "local", "deny", "allow"] {
        cfg.set("rate_limit.on_backend_error", mode);
        let path = cfg.write_as(&format!("{mode}-{}.toml", gws.len()));
        if session.is_none() {
            session = Some(owner_session(&path));
        }
        gws.push((mode, Gateway::start(&path)));
    }
    let session = session.unwrap();
    // Redis answers: the shared key spends 2 of its 10 credits on each
    // `local` instance; each other key, 2 of its 5.
    let (shared, _) = create(&gws[0].1, &session, json!({"credits": {"remaining": 10}})).await;
    let mut keys = Vec::new();
    for (i, (_, gw)) in gws.iter().enumerate() {
        let (key, first) = match i {
            0 | 1 => (shared.clone(), 9 - 2 * i as u64),
            _ => (
                create(gw, &session, json!({"credits": {"remaining": 5}}))
                    .await
                    .0,
                4,
            ),
        };
        for left in [first, first - 1] {
            assert_eq!(call(gw, CLUSTERS, &key, None).await.credits, Some(left));
        }
        keys.push(key);
    }
    let all: Vec<&Gateway> = gws.iter().map(|(_, gw)| gw).collect();
    until_counted(&all, 4).await;
    proxy.set(ProxyMode::Cut);
    let exhausted = json!("credits_exhausted");
    for (i, ((mode, gw), key)) in gws.iter().zip(&keys).enumerate() {
        let mut seen = Vec::new();
        for _ in 0..4 {
            let a = call(gw, CLUSTERS, key, None).await;
            seen.push((a.status, a.credits, a.body["details"]["reason"].clone()));
        }
        let share = |n: u64| {
            let mut want: Vec<_> = (0..n)
                .rev()
                .map(|left| (200, Some(left), Value::Null))
                .collect();
            want.resize(4, (429, Some(0), exhausted.clone()));
            want
        };
        let want = match (*mode, i) {
            // Each spends its share of the last count it saw, divided by
            // the 4 instances: the first saw 8 left and spends 2, the
            // second saw 6 and spends 1. Had every instance seen the same
            // count, together they could spend it all, and no more.
            ("local", 0) => share(2),
            ("local", _) => share(1),
            // The rate limit refuses: nothing is spent.
            ("deny", _) => vec![(429, Some(3), Value::Null); 4],
            // Let through, spending nothing.
            _ => vec![(200, Some(3), Value::Null); 4],
        };
        assert_eq!(seen, want, "on_backend_error = {mode}, instance {i}");
    }
}
