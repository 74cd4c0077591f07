//! Rate limits shared by several gateway instances through Redis: the
//! same bucket whichever instance a client reaches, the GCRA bound under concurrency, the
//! same headers as the local backend, the auth-failure guard shared, and each
//! `on_backend_error` mode while Redis is unreachable (a TCP proxy the test cuts).
mod common;

use common::scale::*;
use common::*;
use std::time::{Duration, Instant};

const CLUSTERS: &str = "/api/v1/clusters?organization_id=acme";

/// A config on a fresh SQLite store with policies `default` (credential), `org`
/// (organization) and `ip` (client IP), each `requests` per `per`, and routes
/// `/api/v1/org-limited` and `/public/ping` using the latter two.
fn config(up: &MockUpstream, requests: i64, per: &str) -> TestConfig {
    let mut cfg = TestConfig::new(up.addr);
    for (name, key) in [
        ("default", "credential"),
        ("org", "organization"),
        ("ip", "client_ip"),
    ] {
        cfg.set(&format!("rate_limit.policies.{name}.requests"), requests);
        cfg.set(&format!("rate_limit.policies.{name}.per"), per);
        cfg.set(&format!("rate_limit.policies.{name}.key"), key);
    }
    cfg.set("rate_limit.redis_timeout", "200ms");
    cfg.route("method = \"GET\"\npath = \"/api/v1/org-limited\"\nauth = \"api_key\"\nscope = \"clusters:read\"\norganization = \"query:organization_id\"\nupstream = \"clusters\"\nrate_limit = \"org\"");
    cfg.route("method = \"GET\"\npath = \"/public/ping\"\nauth = \"none\"\nupstream = \"clusters\"\nrate_limit = \"ip\"");
    cfg
}

fn new_key(config: &std::path::Path) -> String {
    create_key(config, "acme", "alice", "clusters:read").0
}

/// Status and the rate-limit headers of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Limited {
    status: u16,
    limit: Option<String>,
    remaining: Option<String>,
    reset: Option<u64>,
    retry_after: Option<String>,
    policy: Option<String>,
    ratelimit: Option<String>,
}

async fn get(gw: &Gateway, target: &str, key: Option<&str>) -> Limited {
    limited(client().get(gw.url(target)), key).await
}

/// Sends `req` (with `key` as its bearer credential, if any) and reads the limit fields.
async fn limited(mut req: reqwest::RequestBuilder, key: Option<&str>) -> Limited {
    if let Some(key) = key {
        req = req.bearer_auth(key);
    }
    let res = req.send().await.unwrap();
    let h = |name: &str| {
        res.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    };
    Limited {
        status: res.status().as_u16(),
        limit: h("x-ratelimit-limit"),
        remaining: h("x-ratelimit-remaining"),
        reset: h("x-ratelimit-reset").map(|v| v.parse().unwrap()),
        retry_after: h("retry-after"),
        policy: h("ratelimit-policy"),
        ratelimit: h("ratelimit"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_alternating_instances_gets_exactly_the_capacity_under_every_policy_key() {
    let prefix = RedisPrefix::new();
    let up = MockUpstream::start().await;
    let mut cfg = config(&up, 5, "1h");
    cfg.redis(&redis_url(), &prefix.0);
    let path = cfg.write();
    let seed = seed(&path, "acme", "alice", "owner", "clusters:read");
    let second = new_key(&path);
    let gws = [Gateway::start(&path), Gateway::start(&path)];

    // Credential: one key, alternating instances.
    let mut statuses = Vec::new();
    let mut remaining = Vec::new();
    for i in 0..12 {
        let r = get(&gws[i % 2], CLUSTERS, Some(&seed.key)).await;
        statuses.push(r.status);
        remaining.push(r.remaining.unwrap());
    }
    assert_eq!(statuses, [[200; 5].as_slice(), &[429; 7]].concat());
    assert_eq!(remaining[..5], ["4", "3", "2", "1", "0"]);

    // Organization: two keys of one organization share the bucket.
    let org = "/api/v1/org-limited?organization_id=acme";
    let mut allowed = 0;
    for i in 0..12 {
        let key = if i % 3 == 0 { &second } else { &seed.key };
        if get(&gws[i % 2], org, Some(key)).await.status == 200 {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 5, "organization-keyed policy across instances");

    // Client IP, no credential at all.
    let mut allowed = 0;
    for i in 0..12 {
        if get(&gws[i % 2], "/public/ping", None).await.status == 200 {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 5, "client_ip-keyed policy across instances");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_over_two_instances_never_beat_the_gcra_bound() {
    let prefix = RedisPrefix::new();
    let up = MockUpstream::start().await;
    // 4 per second: one token every 250 ms, burst 4.
    let mut cfg = config(&up, 4, "1s");
    cfg.redis(&redis_url(), &prefix.0);
    let path = cfg.write();
    let seed = seed(&path, "acme", "alice", "owner", "clusters:read");
    let gws = std::sync::Arc::new([Gateway::start(&path), Gateway::start(&path)]);
    let interval = Duration::from_millis(250);
    let origin = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..6 {
        let gws = gws.clone();
        let key = seed.key.clone();
        tasks.push(tokio::spawn(async move {
            let mut admitted = Vec::new();
            let mut refused = 0;
            while origin.elapsed() < Duration::from_millis(2_500) {
                let sent = origin.elapsed();
                let r = get(&gws[t % 2], CLUSTERS, Some(&key)).await;
                let done = origin.elapsed();
                match r.status {
                    200 => admitted.push((sent, done)),
                    429 => refused += 1,
                    other => panic!("status {other}"),
                }
            }
            (admitted, refused)
        }));
    }
    let mut admitted = Vec::new();
    let mut refused = 0;
    for task in tasks {
        let (a, r) = task.await.unwrap();
        admitted.extend(a);
        refused += r;
    }
    assert!(refused > 0, "no contention: the test proved nothing");
    assert!(admitted.len() >= 4, "{} admitted", admitted.len());
    // Each admission was decided inside [sent, done]. For any run of admissions (sorted by
    // completion), all were decided inside [earliest sent, last done]: that window's
    // length bounds their number.
    admitted.sort_by_key(|&(_, done)| done);
    for i in 0..admitted.len() {
        let mut earliest = admitted[i].0;
        for (j, &(sent, done)) in admitted.iter().enumerate().skip(i) {
            earliest = earliest.min(sent);
            let count = (j - i + 1) as u128;
            let bound = 4 + (done - earliest).as_nanos() / interval.as_nanos();
            assert!(
                count <= bound,
                "{count} admissions within {:?} (bound {bound})",
                done - earliest
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_headers_equal_the_local_backend_s_including_the_ietf_fields() {
    let prefix = RedisPrefix::new();
    let up = MockUpstream::start().await;
    let mut cfg = config(&up, 3, "1m");
    cfg.set("rate_limit.ietf_headers", true);
    let local_path = cfg.write_as("local.toml");
    cfg.redis(&redis_url(), &prefix.0);
    // A Redis that fails refuses (429 at once) rather than falling back to
    // the very local backend this test compares with.
    cfg.set("rate_limit.on_backend_error", "deny");
    let redis_path = cfg.write();
    let seed = seed(&redis_path, "acme", "alice", "owner", "clusters:read");
    let local = Gateway::start(&local_path);
    let redis = Gateway::start(&redis_path);
    for i in 0..5 {
        let l = get(&local, CLUSTERS, Some(&seed.key)).await;
        let r = get(&redis, CLUSTERS, Some(&seed.key)).await;
        // Both backends round the same way; only a second boundary between the two calls
        // may move the absolute reset (and the IETF `t`) by one.
        let (lr, rr) = (l.reset.unwrap(), r.reset.unwrap());
        assert!(lr.abs_diff(rr) <= 1, "request {i}: reset {lr} vs {rr}");
        let strip = |x: &Limited| Limited {
            reset: None,
            ratelimit: x
                .ratelimit
                .as_ref()
                .map(|v| v.split(";t=").next().unwrap().to_string()),
            ..x.clone()
        };
        assert_eq!(strip(&l), strip(&r), "request {i}");
        assert_eq!(
            l.policy.as_deref(),
            Some("\"3-per-60s\";q=3;w=60"),
            "request {i}"
        );
        let t: u64 = r
            .ratelimit
            .as_ref()
            .unwrap()
            .split(";t=")
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        assert!(t <= 60, "t={t}");
    }
    let refused = get(&redis, CLUSTERS, Some(&seed.key)).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.remaining.as_deref(), Some("0"));
    assert_eq!(
        refused
            .ratelimit
            .as_deref()
            .map(|v| v.starts_with("\"3-per-60s\";r=0;t=")),
        Some(true)
    );
    // One token every 20 s: the next is due in (0, 20] s.
    let retry: u64 = refused.retry_after.unwrap().parse().unwrap();
    assert!((1..=20).contains(&retry), "retry-after {retry}");
    // The decisions were Redis's: its bucket is there, and nothing fell back.
    assert!(!prefix.keys().is_empty(), "no bucket in Redis");
    assert!(
        !redis.log_text().contains("rate-limit backend redis"),
        "{}",
        redis.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_failures_are_counted_once_for_every_instance() {
    let prefix = RedisPrefix::new();
    let up = MockUpstream::start().await;
    let mut cfg = config(&up, 100, "1m");
    cfg.set("rate_limit.auth_failures.requests", 3);
    cfg.set("rate_limit.auth_failures.per", "1h");
    cfg.redis(&redis_url(), &prefix.0);
    let path = cfg.write();
    let _ = seed(&path, "acme", "alice", "owner", "clusters:read");
    let gws = [Gateway::start(&path), Gateway::start(&path)];
    let bad = format!("mpg_{}", "x".repeat(38));
    let mut statuses = Vec::new();
    for i in 0..6 {
        statuses.push(get(&gws[i % 2], CLUSTERS, Some(&bad)).await.status);
    }
    assert_eq!(statuses, [401, 401, 401, 429, 429, 429]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_on_backend_error_mode_answers_as_named_and_returns_to_redis() {
    let prefix = RedisPrefix::new();
    let proxy = TcpProxy::start(host_port(&redis_url())).await;
    let up = MockUpstream::start().await;
    let mut cfg = config(&up, 3, "1h");
    cfg.redis(&via(&redis_url(), proxy.addr), &prefix.0)
        .admin_on();
    let mut gws = Vec::new();
    let mut keys = Vec::new();
    for mode in ["local", "deny", "allow"] {
        cfg.set("rate_limit.on_backend_error", mode);
        let path = cfg.write_as(&format!("{mode}.toml"));
        if keys.is_empty() {
            let _ = seed(&path, "acme", "alice", "owner", "clusters:read");
        }
        keys.push(new_key(&path));
        gws.push((mode, Gateway::start(&path)));
    }
    // Redis answers: one token of three taken from each key's shared bucket.
    for ((_, gw), key) in gws.iter().zip(&keys) {
        let r = get(gw, CLUSTERS, Some(key)).await;
        assert_eq!((r.status, r.remaining.as_deref()), (200, Some("2")));
    }

    proxy.set(ProxyMode::Cut);
    for ((mode, gw), key) in gws.iter().zip(&keys) {
        let mut statuses = Vec::new();
        for _ in 0..5 {
            let started = Instant::now();
            statuses.push(get(gw, CLUSTERS, Some(key)).await.status);
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "{mode}: slow answer"
            );
        }
        let want: &[u16] = match *mode {
            "local" => &[200, 200, 200, 429, 429], // a fresh in-process bucket of 3
            "deny" => &[429; 5],
            _ => &[200; 5],
        };
        assert_eq!(statuses, want, "on_backend_error = {mode}");
        assert!(
            gw.log_text()
                .contains("rate-limit backend redis (meanwhile"),
            "{mode}: not logged"
        );
        let text = metrics(gw.admin.unwrap()).await;
        assert!(
            metric_sum(&text, "mpg_rate_limit_backend_errors_total", &[]) >= 1.0,
            "{mode}: not counted"
        );
        assert!(
            metric_sum(&text, "mpg_rate_limit_backend_duration_seconds_count", &[]) >= 1.0,
            "{mode}: Redis calls not timed"
        );
    }

    // Back on Redis by itself: the shared bucket still holds two tokens for each key.
    proxy.set(ProxyMode::Open);
    for ((mode, gw), key) in gws.iter().zip(&keys) {
        let back = within(Duration::from_secs(15), || async {
            let r = get(gw, CLUSTERS, Some(key)).await;
            r.status == 200 && r.remaining.as_deref() == Some("1")
        })
        .await;
        assert!(back.is_some(), "{mode}: never returned to Redis");
        let r = get(gw, CLUSTERS, Some(key)).await;
        assert_eq!(
            (r.status, r.remaining.as_deref()),
            (200, Some("0")),
            "{mode}"
        );
        assert_eq!(get(gw, CLUSTERS, Some(key)).await.status, 429, "{mode}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_flush_is_survived_without_falling_back() {
    let prefix = RedisPrefix::new();
    let up = MockUpstream::start().await;
    let mut cfg = config(&up, 5, "1h");
    cfg.redis(&redis_url(), &prefix.0).admin_on();
    let path = cfg.write();
    let seed = seed(&path, "acme", "alice", "owner", "clusters:read");
    let gw = Gateway::start(&path);
    for want in ["4", "3"] {
        let r = get(&gw, CLUSTERS, Some(&seed.key)).await;
        assert_eq!(r.remaining.as_deref(), Some(want));
    }
    let client = redis::Client::open(redis_url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    // Still the shared bucket (a local fallback would start again at 4).
    let r = get(&gw, CLUSTERS, Some(&seed.key)).await;
    assert_eq!(r.remaining.as_deref(), Some("2"));
    let text = metrics(gw.admin.unwrap()).await;
    assert_eq!(
        metric_sum(&text, "mpg_rate_limit_backend_errors_total", &[]),
        0.0
    );
}

/// [`get`] from the client address `ip` (the gateways trust the loopback's `X-Forwarded-For`).
async fn get_from(gw: &Gateway, target: &str, key: Option<&str>, ip: &str) -> Limited {
    limited(
        client().get(gw.url(target)).header("x-forwarded-for", ip),
        key,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_credential_takes_one_redis_call_and_a_guard_refusal_spends_no_token() {
    let prefix = RedisPrefix::new();
    let up = MockUpstream::start().await;
    let mut cfg = config(&up, 5, "1h");
    cfg.set("rate_limit.auth_failures.requests", 2);
    cfg.set("rate_limit.auth_failures.per", "1h");
    cfg.set("store.negative_cache_ttl", "1h");
    cfg.set(
        "server.client_ip.trusted_proxies",
        vec!["127.0.0.1".to_string()],
    );
    cfg.redis(&redis_url(), &prefix.0).admin_on();
    let path = cfg.write();
    let seed = seed(&path, "acme", "alice", "owner", "clusters:read");
    let gws = [Gateway::start(&path), Gateway::start(&path)];
    let (a, b) = (&gws[0], &gws[1]);
    let (blocked, other) = ("198.51.100.1", "198.51.100.2");
    // Well-formed but unknown here (issued by another store): looked up, then cached as not found.
    let bad = common::seed(
        &TestConfig::new(up.addr).write(),
        "o",
        "u",
        "owner",
        "clusters:read",
    )
    .key;
    // Redis calls made by `gw` so far (each timed once, whatever it holds).
    let calls = |gw: &Gateway| {
        let admin = gw.admin.unwrap();
        async move {
            let text = metrics(admin).await;
            metric_sum(&text, "mpg_rate_limit_backend_duration_seconds_count", &[])
        }
    };
    // Not cached yet: the guard's peek first, then the lookup, then the policy or the failure.
    let r = get_from(a, CLUSTERS, Some(&seed.key), other).await;
    assert_eq!((r.status, r.remaining.as_deref()), (200, Some("4")));
    assert_eq!(get_from(a, CLUSTERS, Some(&bad), blocked).await.status, 401);
    assert_eq!(calls(a).await, 4.0);
    // Cached: one call per request, the guard's peek with the policy or the failure.
    let r = get_from(a, CLUSTERS, Some(&seed.key), other).await;
    assert_eq!((r.status, r.remaining.as_deref()), (200, Some("3")));
    assert_eq!(calls(a).await, 5.0);
    assert_eq!(get_from(a, CLUSTERS, Some(&bad), blocked).await.status, 401);
    assert_eq!(calls(a).await, 6.0);
    // Two failures: that address is refused with the guard's decision, cached key valid
    // or not, no credential at all, and on the instance that has nothing cached.
    for (gw, key) in [
        (a, Some(&seed.key)),
        (a, Some(&bad)),
        (a, None),
        (b, Some(&seed.key)),
    ] {
        let r = get_from(gw, CLUSTERS, key.map(String::as_str), blocked).await;
        assert_eq!(
            (r.status, r.limit.as_deref(), r.remaining.as_deref()),
            (429, Some("2"), Some("0")),
            "{key:?}"
        );
        assert!(r.retry_after.is_some());
    }
    assert_eq!(calls(a).await, 9.0);
    // The refusals took no token of the key's policy, and counted no authentication.
    let r = get_from(b, CLUSTERS, Some(&seed.key), other).await;
    assert_eq!((r.status, r.remaining.as_deref()), (200, Some("2")));
    let r = get_from(a, CLUSTERS, Some(&seed.key), other).await;
    assert_eq!((r.status, r.remaining.as_deref()), (200, Some("1")));
    let text = metrics(a.admin.unwrap()).await;
    let auth = |result: &str| {
        metric_sum(
            &text,
            "mpg_auth_decisions_total",
            &[&format!("result=\"{result}\"")],
        )
    };
    assert_eq!((auth("ok"), auth("refused")), (3.0, 2.0));
}
