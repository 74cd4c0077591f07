//! The request pipeline over real sockets: the real binary, a real upstream,
//! every status the pipeline gives, and the headers that go with it.
mod common;

use common::*;
use serde_json::Value;
use std::time::{Duration, Instant};

const CLUSTERS: &str = "/api/v1/clusters?organization_id=acme";

struct World {
    up: MockUpstream,
    _cfg: TestConfig,
    path: std::path::PathBuf,
    gw: Gateway,
    seed: Seed,
}

/// A gateway over the shipped routes plus a few test routes, seeded with
/// org `acme`, user `alice` (owner) and a `clusters:read` key.
async fn world(tune: impl FnOnce(&mut TestConfig)) -> World {
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    cfg.set("upstreams.clusters.request_timeout", "1s");
    cfg.set(
        "upstreams.dead.targets",
        vec!["http://127.0.0.1:1".to_string()],
    );
    cfg.set("upstreams.dead.connect_timeout", "500ms");
    cfg.set("rate_limit.policies.tight.requests", 3);
    cfg.set("rate_limit.policies.tight.per", "1m");
    cfg.set("roles.billing", vec!["api-keys:read".to_string()]);
    for (method, path, upstream, policy) in [
        ("GET", "/api/v1/slow", "clusters", "default"),
        ("GET", "/api/v1/busy", "clusters", "default"),
        ("GET", "/api/v1/dead", "dead", "default"),
        ("GET", "/api/v1/limited", "clusters", "tight"),
    ] {
        cfg.route(&format!(
            "method = \"{method}\"\npath = \"{path}\"\nauth = \"api_key\"\nscope = \"clusters:read\"\norganization = \"query:organization_id\"\nupstream = \"{upstream}\"\nrate_limit = \"{policy}\""
        ));
    }
    cfg.route("method = \"GET\"\npath = \"/public/ping\"\nauth = \"none\"\nupstream = \"clusters\"\nrate_limit = \"none\"");
    tune(&mut cfg);
    let path = cfg.write();
    let seed = seed(
        &path,
        "acme",
        "alice",
        "owner",
        "clusters:read,clusters:write",
    );
    let gw = Gateway::start(&path);
    World {
        up,
        _cfg: cfg,
        path,
        gw,
        seed,
    }
}

async fn get(w: &World, target: &str, token: Option<&str>) -> reqwest::Response {
    let mut req = client().get(w.gw.url(target));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    req.send().await.unwrap()
}

async fn error_of(res: reqwest::Response) -> (u16, reqwest::header::HeaderMap, Value) {
    let status = res.status().as_u16();
    let headers = res.headers().clone();
    assert_eq!(
        headers["content-type"], "application/json",
        "status {status}"
    );
    assert!(
        headers.contains_key("x-request-id"),
        "status {status} lacks X-Request-Id"
    );
    let body: Value = res.json().await.unwrap();
    assert!(
        body["error"].is_string() && body["message"].is_string(),
        "{body}"
    );
    (status, headers, body)
}

#[tokio::test]
async fn an_api_key_reaches_the_upstream_with_the_identity_the_gateway_vouches_for() {
    let w = world(|_| {}).await;
    let res = client()
        .get(w.gw.url(CLUSTERS))
        .bearer_auth(&w.seed.key)
        .header("x-mpg-user-id", "mallory")
        .header("x-mpg-organization-id", "evil")
        .header("x-forwarded-for", "6.6.6.6")
        .header("x-request-id", "trace-123")
        .header("connection", "keep-alive, x-mpg-role, x-request-id")
        .header("x-custom", "kept")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["x-request-id"], "trace-123");
    assert_eq!(res.headers()["x-ratelimit-limit"], "100");
    assert_eq!(res.headers()["x-ratelimit-remaining"], "99");
    let reset: u64 = res.headers()["x-ratelimit-reset"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(reset >= now && reset <= now + 61, "reset {reset} now {now}");
    assert!(
        !res.headers().contains_key("x-upstream-hop"),
        "Connection-named upstream header leaked"
    );

    let seen = w.up.last();
    let h = &seen.headers;
    assert_eq!(seen.uri, CLUSTERS);
    assert!(
        !h.contains_key("authorization"),
        "Authorization reached the upstream"
    );
    assert_eq!(h["x-mpg-organization-id"], "acme");
    assert_eq!(h["x-mpg-user-id"], "alice");
    assert_eq!(h["x-mpg-role"], "owner");
    assert_eq!(h["x-mpg-auth"], "api_key");
    assert_eq!(h["x-mpg-key-id"], w.seed.key_id.as_str());
    assert_eq!(h["x-mpg-scopes"], "clusters:read clusters:write");
    assert_eq!(h["x-request-id"], "trace-123");
    // Each field the gateway sets arrives once: the client's copies are gone.
    for name in ["x-request-id", "x-mpg-role", "x-forwarded-for", "host"] {
        assert_eq!(h.get_all(name).iter().count(), 1, "{name}");
    }
    assert_eq!(h["x-forwarded-for"], "127.0.0.1");
    assert_eq!(h["x-forwarded-proto"], "http");
    assert_eq!(h["x-forwarded-host"], w.gw.addr.to_string().as_str());
    assert_eq!(h["x-custom"], "kept");
    assert_eq!(h.get_all("x-mpg-user-id").iter().count(), 1);
    assert!(!h.contains_key("keep-alive"));
}

#[tokio::test]
async fn every_401_reason_and_nothing_reaches_the_upstream() {
    let w = world(|c| {
        c.set("rate_limit.auth_failures.requests", 1000);
    })
    .await;
    let unknown = {
        // Well-formed (right length, alphabet and checksum) but never issued.
        let other = TestConfig::new(w.up.addr);
        let p = other.write();
        seed(&p, "o", "u", "owner", "clusters:read").key
    };
    let expiring = cli_ok(
        &w.path,
        &[
            "keys",
            "create",
            "--org",
            "acme",
            "--user",
            "alice",
            "--name",
            "short",
            "--scopes",
            "clusters:read",
            "--expires-in",
            "1s",
        ],
    );
    let revoked = cli_ok(
        &w.path,
        &[
            "keys",
            "create",
            "--org",
            "acme",
            "--user",
            "alice",
            "--name",
            "r",
            "--scopes",
            "clusters:read",
        ],
    );
    cli_ok(
        &w.path,
        &["keys", "revoke", revoked["id"].as_str().unwrap()],
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;

    let mut bad_checksum = w.seed.key.clone();
    let last = bad_checksum.pop().unwrap();
    bad_checksum.push(if last == 'A' { 'B' } else { 'A' });
    let cases: Vec<(Option<String>, &str)> = vec![
        (None, "missing"),
        (Some("Basic dXNlcjpwYXNz".into()), "malformed"),
        (Some(format!("Bearer {bad_checksum}")), "malformed"),
        (Some("Bearer mpg_short".into()), "malformed"),
        (Some(format!("Bearer  {}", w.seed.key)), "malformed"),
        (Some(format!("Bearer {unknown}")), "invalid"),
        (
            Some(format!("Bearer {}", expiring["key"].as_str().unwrap())),
            "expired",
        ),
        (
            Some(format!("Bearer {}", revoked["key"].as_str().unwrap())),
            "revoked",
        ),
        (
            Some(format!("Bearer {}", w.seed.session)),
            "wrong_credential_type",
        ),
    ];
    for (auth, reason) in cases {
        let mut req = client().get(w.gw.url(CLUSTERS));
        if let Some(a) = &auth {
            req = req.header("authorization", a);
        }
        let (status, headers, body) = error_of(req.send().await.unwrap()).await;
        assert_eq!(status, 401, "{reason}: {body}");
        assert_eq!(headers["www-authenticate"], "Bearer", "{reason}");
        assert_eq!(body["error"], "Unauthorized");
        assert_eq!(body["details"]["reason"], reason, "{auth:?}");
    }
    // An API key on a session route.
    let (status, _, body) = error_of(
        get(
            &w,
            "/api/v1/api-keys?organization_id=acme",
            Some(&w.seed.key),
        )
        .await,
    )
    .await;
    assert_eq!(
        (status, body["details"]["reason"].as_str()),
        (401, Some("wrong_credential_type"))
    );
    // Two Authorization headers are refused, never "first wins".
    let res = raw_get(
        w.gw.addr,
        CLUSTERS,
        &format!(
            "Authorization: Bearer {}\r\nAuthorization: Bearer {}\r\n",
            w.seed.key, w.seed.key
        ),
    )
    .await;
    assert_eq!(res.status, 401);
    assert_eq!(res.json()["details"]["reason"], "malformed");
    assert_eq!(w.up.count(), 0, "a refused request reached the upstream");
}

#[tokio::test]
async fn the_organization_parameter_is_validated_and_named() {
    let w = world(|_| {}).await;
    for target in [
        "/api/v1/clusters",
        "/api/v1/clusters?organization_id=",
        "/api/v1/clusters?organization_id=acme&organization_id=acme",
        "/api/v1/clusters?organization_id=acme&organization%5Fid=other",
    ] {
        let (status, _, body) = error_of(get(&w, target, Some(&w.seed.key)).await).await;
        assert_eq!(status, 400, "{target}: {body}");
        assert_eq!(body["error"], "BadRequest");
        assert_eq!(body["details"]["field"], "organization_id", "{target}");
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .contains("organization_id"),
            "{body}"
        );
    }
    assert_eq!(w.up.count(), 0);
}

#[tokio::test]
async fn another_organization_is_not_found_and_a_missing_scope_is_forbidden() {
    let w = world(|_| {}).await;
    seed(&w.path, "globex", "bob", "owner", "clusters:read");
    let (status, _, body) = error_of(
        get(
            &w,
            "/api/v1/clusters?organization_id=globex",
            Some(&w.seed.key),
        )
        .await,
    )
    .await;
    assert_eq!((status, body["error"].as_str()), (404, Some("NotFound")));

    let write_only = cli_ok(
        &w.path,
        &[
            "keys",
            "create",
            "--org",
            "acme",
            "--user",
            "alice",
            "--name",
            "w",
            "--scopes",
            "clusters:write",
        ],
    );
    let (status, _, body) = error_of(get(&w, CLUSTERS, write_only["key"].as_str()).await).await;
    assert_eq!(status, 403);
    assert_eq!(body["error"], "Forbidden");
    assert_eq!(body["details"]["required_scope"], "clusters:read");
    assert_eq!(w.up.count(), 0);
}

#[tokio::test]
async fn a_role_that_loses_the_permission_is_forbidden_within_a_second() {
    let w = world(|_| {}).await;
    assert_eq!(get(&w, CLUSTERS, Some(&w.seed.key)).await.status(), 200);
    cli_ok(
        &w.path,
        &[
            "members", "add", "--org", "acme", "--user", "alice", "--role", "billing",
        ],
    );
    let started = Instant::now();
    loop {
        let res = get(&w, CLUSTERS, Some(&w.seed.key)).await;
        if res.status() == 403 {
            let (_, _, body) = error_of(res).await;
            assert_eq!(body["details"]["required_scope"], "clusters:read");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "role change not seen within 1 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_revoked_key_stops_working_within_a_second_even_when_cached() {
    let w = world(|_| {}).await;
    assert_eq!(get(&w, CLUSTERS, Some(&w.seed.key)).await.status(), 200);
    cli_ok(&w.path, &["keys", "revoke", &w.seed.key_id]);
    let started = Instant::now();
    loop {
        let res = get(&w, CLUSTERS, Some(&w.seed.key)).await;
        if res.status() == 401 {
            let (_, _, body) = error_of(res).await;
            assert_eq!(body["details"]["reason"], "revoked");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "revocation not seen within 1 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn routing_answers_404_405_and_400_for_ambiguous_targets() {
    let w = world(|_| {}).await;
    let (status, _, body) = error_of(get(&w, "/api/v1/nothing", Some(&w.seed.key)).await).await;
    assert_eq!((status, body["error"].as_str()), (404, Some("NotFound")));
    let res = client()
        .delete(w.gw.url(CLUSTERS))
        .bearer_auth(&w.seed.key)
        .send()
        .await
        .unwrap();
    let (status, headers, body) = error_of(res).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (405, Some("MethodNotAllowed"))
    );
    assert_eq!(headers["allow"], "GET, HEAD, POST");
    let auth = format!("Authorization: Bearer {}\r\n", w.seed.key);
    for target in [
        "/api/v1/../v1/clusters?organization_id=acme",
        "/api/v1/./clusters?organization_id=acme",
        "/api/v1//clusters?organization_id=acme",
        "/api/v1/clusters/?organization_id=acme",
        "/api/v1/%2e%2e/v1/clusters?organization_id=acme",
        "/api/v1/%2E%2e/v1/clusters?organization_id=acme",
        "/api/v1%2Fclusters?organization_id=acme",
        "/api/v1%5cclusters?organization_id=acme",
        "/api/v1/clusters%00?organization_id=acme",
        "/api/v1\\clusters?organization_id=acme",
        "http://evil.example/api/v1/clusters?organization_id=acme",
    ] {
        let res = raw_get(w.gw.addr, target, &auth).await;
        assert_eq!(res.status, 400, "{target}: {res:?}");
        assert_eq!(res.json()["error"], "BadRequest", "{target}");
    }
    // Matched as received: an encoded letter or a `;` parameter is another path.
    for target in [
        "/api/v1/clust%65rs?organization_id=acme",
        "/api/v1/clusters;x=1?organization_id=acme",
        "/API/v1/clusters?organization_id=acme",
    ] {
        let res = raw_get(w.gw.addr, target, &auth).await;
        assert_eq!(res.status, 404, "{target}: {res:?}");
    }
    assert_eq!(w.up.count(), 0);
}

#[tokio::test]
async fn the_limit_answers_429_with_retry_after_and_counts_down() {
    let w = world(|_| {}).await;
    let target = "/api/v1/limited?organization_id=acme";
    for remaining in ["2", "1", "0"] {
        let res = get(&w, target, Some(&w.seed.key)).await;
        assert_eq!(res.status(), 200);
        assert_eq!(res.headers()["x-ratelimit-limit"], "3");
        assert_eq!(res.headers()["x-ratelimit-remaining"], remaining);
    }
    let (status, headers, body) = error_of(get(&w, target, Some(&w.seed.key)).await).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (429, Some("TooManyRequests"))
    );
    let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(
        (1..=20).contains(&retry),
        "one token per 20 s: retry after {retry}"
    );
    assert_eq!(headers["x-ratelimit-remaining"], "0");
    assert!(headers.contains_key("x-ratelimit-reset"));
    assert_eq!(w.up.count(), 3);
}

#[tokio::test]
async fn ips_that_pile_up_401s_get_429_before_any_lookup() {
    let w = world(|c| {
        c.set("rate_limit.auth_failures.requests", 3);
    })
    .await;
    // The valid key is cached by a first request; a well-formed unknown one by its first 401.
    assert_eq!(get(&w, CLUSTERS, Some(&w.seed.key)).await.status(), 200);
    let unknown = {
        let other = TestConfig::new(w.up.addr);
        seed(&other.write(), "o", "u", "owner", "clusters:read").key
    };
    assert_eq!(get(&w, CLUSTERS, Some("mpg_garbage")).await.status(), 401);
    for _ in 0..2 {
        assert_eq!(get(&w, CLUSTERS, Some(&unknown)).await.status(), 401);
    }
    // The unknown key, cached or not, and even a valid (cached) key from that IP now wait.
    let status = get(&w, CLUSTERS, Some(&unknown)).await.status();
    assert_eq!(status, 429);
    let (status, headers, _) = error_of(get(&w, CLUSTERS, Some(&w.seed.key)).await).await;
    assert_eq!(status, 429);
    assert!(headers.contains_key("retry-after"));
    // The guard's 429 says its bucket as every 429 does: 3 failures a minute.
    assert_eq!(headers["x-ratelimit-limit"], "3", "{headers:?}");
    assert_eq!(headers["x-ratelimit-remaining"], "0", "{headers:?}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let reset: u64 = headers["x-ratelimit-reset"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (now..=now + 61).contains(&reset),
        "reset {reset}, now {now}"
    );
    let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(
        (1..=20).contains(&retry),
        "one failure forgiven per 20 s: {retry}"
    );
    // Routes without authentication are not affected.
    assert_eq!(get(&w, "/public/ping", None).await.status(), 200);
}

#[tokio::test]
async fn upstream_failures_are_502_504_and_pass_through_keeps_retry_after() {
    let w = world(|_| {}).await;
    let (status, _, body) =
        error_of(get(&w, "/api/v1/dead?organization_id=acme", Some(&w.seed.key)).await).await;
    assert_eq!((status, body["error"].as_str()), (502, Some("BadGateway")));
    let started = Instant::now();
    let (status, _, body) =
        error_of(get(&w, "/api/v1/slow?organization_id=acme", Some(&w.seed.key)).await).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (504, Some("GatewayTimeout"))
    );
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "timeout took {:?}",
        started.elapsed()
    );
    let res = get(&w, "/api/v1/busy?organization_id=acme", Some(&w.seed.key)).await;
    assert_eq!(res.status(), 409);
    assert_eq!(res.headers()["retry-after"], "7");
    assert!(res.headers().contains_key("x-ratelimit-limit"));
    assert!(res.headers().contains_key("x-request-id"));
    assert_eq!(
        res.text().await.unwrap(),
        "{\"error\":\"Conflict\",\"message\":\"cluster is still changing\"}"
    );
}

#[tokio::test]
async fn body_and_header_limits_answer_413_and_431() {
    let w = world(|c| {
        c.set("server.limits.max_body_bytes", 1024);
    })
    .await;
    let post = |body: Vec<u8>| {
        client()
            .post(w.gw.url(CLUSTERS))
            .bearer_auth(&w.seed.key)
            .body(body)
            .send()
    };
    assert_eq!(post(vec![b'x'; 1000]).await.unwrap().status(), 200);
    assert_eq!(w.up.last().body.len(), 1000);
    let (status, _, body) = error_of(post(vec![b'x'; 4096]).await.unwrap()).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (413, Some("PayloadTooLarge"))
    );
    // Chunked, no Content-Length: refused while streaming.
    let chunks =
        futures_util::stream::iter((0..8).map(|_| Ok::<_, std::io::Error>(vec![b'y'; 512])));
    let res = client()
        .post(w.gw.url(CLUSTERS))
        .bearer_auth(&w.seed.key)
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 413);
    let (status, _, body) = error_of(
        client()
            .get(w.gw.url(CLUSTERS))
            .bearer_auth(&w.seed.key)
            .header("x-big", "a".repeat(20_000))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (431, Some("RequestHeaderFieldsTooLarge"))
    );
}

#[tokio::test]
async fn request_ids_are_kept_when_sane_and_made_otherwise() {
    let w = world(|_| {}).await;
    let res = client()
        .get(w.gw.url("/public/ping"))
        .header("x-request-id", "bad id with spaces")
        .send()
        .await
        .unwrap();
    let id = res.headers()["x-request-id"].to_str().unwrap().to_string();
    assert_ne!(id, "bad id with spaces");
    assert_eq!(id.len(), 32);
    assert_eq!(w.up.last().headers["x-request-id"], id.as_str());
    let res = get(&w, "/api/v1/nothing", None).await;
    assert!(res.headers().contains_key("x-request-id"));
}

#[tokio::test]
async fn secrets_never_reach_the_log() {
    let w = world(|_| {}).await;
    // One character changed: to 'Z', or to 'Y' where it was a 'Z' already.
    let mut wrong = w.seed.key.clone();
    let other = if &wrong[10..11] == "Z" { "Y" } else { "Z" };
    wrong.replace_range(10..11, other);
    let in_query = format!("/api/v1/clusters?organization_id=acme&token={}", w.seed.key);
    let sent: [(&str, &str, u16); 5] = [
        (CLUSTERS, &w.seed.key, 200),
        (
            "/api/v1/api-keys?organization_id=acme",
            &w.seed.session,
            200,
        ),
        (CLUSTERS, &wrong, 401),
        (&in_query, &w.seed.key, 400),
        ("/api/v1/dead?organization_id=acme", &w.seed.key, 502),
    ];
    let mut ids = Vec::new();
    for (target, token, status) in sent {
        let res = get(&w, target, Some(token)).await;
        assert_eq!(res.status(), status, "{target}");
        ids.push(res.headers()["x-request-id"].to_str().unwrap().to_string());
    }
    // Every request's access-log line is written before the log is searched.
    let start = std::time::Instant::now();
    while !ids.iter().all(|id| {
        w.gw.log_text()
            .contains(&format!("\"request_id\":\"{id}\""))
    }) {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "an access-log line is missing"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let log = w.gw.log_text();
    for secret in [&w.seed.key, &w.seed.session, &wrong] {
        assert!(!log.contains(secret.as_str()), "a secret reached the log");
        assert!(
            !log.contains(&secret[4..]),
            "a secret's body reached the log"
        );
    }
}

#[tokio::test]
async fn an_organization_limit_is_one_bucket_that_only_members_spend() {
    // An `organization`-keyed policy: an API key and a member's session
    // naming the same organization spend one bucket; a stranger naming it
    // is refused later (stage 5) and must not drain it on the way.
    let w = world(|cfg| {
        cfg.set("rate_limit.policies.orgwide.requests", 2);
        cfg.set("rate_limit.policies.orgwide.per", "1m");
        cfg.set("rate_limit.policies.orgwide.key", "organization");
        for (path, auth) in [
            ("/api/v1/org-limited", "api_key"),
            ("/api/v1/org-limited-s", "session"),
        ] {
            cfg.route(&format!(
                "method = \"GET\"\npath = \"{path}\"\nauth = \"{auth}\"\nscope = \"clusters:read\"\norganization = \"query:organization_id\"\nupstream = \"clusters\"\nrate_limit = \"orgwide\""
            ));
        }
    })
    .await;
    let stranger = seed(&w.path, "evil", "mallory", "owner", "clusters:read");
    for _ in 0..2 {
        let res = get(
            &w,
            "/api/v1/org-limited-s?organization_id=acme",
            Some(&stranger.session),
        )
        .await;
        assert_eq!(res.status(), 404, "a stranger is not told acme exists");
    }
    let res = get(
        &w,
        "/api/v1/org-limited?organization_id=acme",
        Some(&w.seed.key),
    )
    .await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["x-ratelimit-remaining"], "1");
    let res = get(
        &w,
        "/api/v1/org-limited-s?organization_id=acme",
        Some(&w.seed.session),
    )
    .await;
    assert_eq!(res.status(), 200);
    assert_eq!(
        res.headers()["x-ratelimit-remaining"],
        "0",
        "the key's bucket"
    );
    let (status, _, body) = error_of(
        get(
            &w,
            "/api/v1/org-limited?organization_id=acme",
            Some(&w.seed.key),
        )
        .await,
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (429, Some("TooManyRequests"))
    );
    assert_eq!(w.up.count(), 2);
}

#[tokio::test]
async fn path_parameters_are_percent_decoded_before_the_organization_and_key_checks() {
    // A client that encodes path segments (`encodeURIComponent` turns `@`
    // into `%40`) names the same organization or key as one that does not,
    // and the gateway checks the value the upstream will decode.
    let w = world(|cfg| {
        cfg.route("method = \"GET\"\npath = \"/api/v1/orgs/{org}/clusters\"\nauth = \"api_key\"\nscope = \"clusters:read\"\norganization = \"path:org\"\nupstream = \"clusters\"");
    })
    .await;
    let ops = seed(&w.path, "ops@acme", "bob", "owner", "clusters:read");
    for target in [
        "/api/v1/orgs/ops@acme/clusters",
        "/api/v1/orgs/ops%40acme/clusters",
        "/api/v1/orgs/%6Fps%40acme/clusters",
    ] {
        let res = get(&w, target, Some(&ops.key)).await;
        assert_eq!(res.status(), 200, "{target}");
        let seen = w.up.last();
        assert_eq!(seen.uri, target, "forwarded as received");
        assert_eq!(
            seen.headers["x-mpg-organization-id"], "ops@acme",
            "{target}"
        );
        // Another organization's key is still refused, however it is spelled.
        let res = get(&w, target, Some(&w.seed.key)).await;
        assert_eq!(res.status(), 404, "{target}");
    }
    // `key:id`: the key's id, an unreserved character encoded.
    let encoded = format!("/api/v1/api-keys/%6B{}", &w.seed.key_id[1..]);
    let res = get(&w, &encoded, Some(&w.seed.session)).await;
    assert_eq!(res.status(), 200, "{encoded}");
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["id"], w.seed.key_id.as_str());
}

#[tokio::test]
async fn a_query_parameter_that_does_not_decode_is_named_in_details_field() {
    let w = world(|_| {}).await;
    for (query, field) in [
        ("organization_id=acme%ff", "organization_id"),
        ("organization_id=acme&name=%c3%28", "name"),
        ("organization_id=acme&n%ffme=1", "query"),
    ] {
        let target = format!("/api/v1/clusters?{query}");
        let (status, headers, body) = error_of(get(&w, &target, Some(&w.seed.key)).await).await;
        assert_eq!((status, body["error"].as_str()), (400, Some("BadRequest")));
        assert_eq!(body["details"]["field"], field, "{query}: {body}");
        assert!(
            body["message"].as_str().unwrap().starts_with(field),
            "{query}: {body}"
        );
        assert!(headers.contains_key("x-ratelimit-limit"), "reached stage 3");
    }
    let many: Vec<String> = (0..65).map(|i| format!("p{i}=1")).collect();
    let target = format!("/api/v1/clusters?organization_id=acme&{}", many.join("&"));
    let (status, _, body) = error_of(get(&w, &target, Some(&w.seed.key)).await).await;
    assert_eq!(status, 400);
    assert_eq!(body["details"]["field"], "query", "{body}");
    assert_eq!(w.up.count(), 0);
}

// === HEAD wherever GET is served ===

/// `method target` over HTTP/1.1 (`Connection: close`), read raw.
async fn raw_request(w: &World, method: &str, target: &str, token: Option<&str>) -> RawResponse {
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let req = format!("{method} {target} HTTP/1.1\r\nHost: a\r\n{auth}Connection: close\r\n\r\n");
    raw(w.gw.addr, req.as_bytes()).await
}

/// Fields that differ from one response to the next: compared by name only.
const PER_RESPONSE: [&str; 5] = [
    "date",
    "x-request-id",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "retry-after",
];

/// A response's fields, lower-cased and sorted, values of [`PER_RESPONSE`]
/// and `Content-Length` left out.
fn comparable<'a>(fields: impl Iterator<Item = (&'a str, &'a str)>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = fields
        .map(|(n, v)| {
            let n = n.to_ascii_lowercase();
            let v = if PER_RESPONSE.contains(&n.as_str()) || n == "content-length" {
                String::new()
            } else {
                v.to_string()
            };
            (n, v)
        })
        .collect();
    out.sort();
    out
}

/// Asserts that `head` is `get`'s answer without its body: the same status
/// and fields, `Content-Length` the length of the GET's body, no body byte.
fn assert_head_is_get_without_body(head: &RawResponse, get: &RawResponse, what: &str) {
    assert_eq!(head.status, get.status, "{what}: {head:?} vs {get:?}");
    assert_eq!(head.body, "", "{what}: a HEAD answer with body bytes");
    assert_ne!(
        get.body, "",
        "{what}: the GET answer has no body to compare"
    );
    assert_eq!(
        head.header("content-length"),
        Some(get.body.len().to_string().as_str()),
        "{what}: {head:?}"
    );
    let fields =
        |r: &RawResponse| comparable(r.headers.iter().map(|(n, v)| (n.as_str(), v.as_str())));
    assert_eq!(fields(head), fields(get), "{what}");
}

#[tokio::test]
async fn head_on_a_get_route_passes_every_stage_and_answers_without_a_body() {
    let w = world(|_| {}).await;
    let key = Some(w.seed.key.as_str());
    // Forwarded as HEAD: the upstream's answer (a fixed 409 with
    // Retry-After) with its length, and no body.
    let busy = "/api/v1/busy?organization_id=acme";
    let get = raw_request(&w, "GET", busy, key).await;
    assert_eq!(get.status, 409, "{get:?}");
    let head = raw_request(&w, "HEAD", busy, key).await;
    assert_head_is_get_without_body(&head, &get, "forwarded");
    assert_eq!(head.header("retry-after"), Some("7"));
    let seen = w.up.last();
    assert_eq!((seen.method.as_str(), seen.uri.as_str()), ("HEAD", busy));
    assert_eq!(w.up.count(), 2);

    // Each stage refuses a HEAD as it refuses the GET: 401 (with
    // WWW-Authenticate), 400 naming the field, 404 for another
    // organization, 403 for a missing scope.
    let write_only = create_key(&w.path, "acme", "alice", "clusters:write").0;
    for (what, target, token) in [
        ("401", CLUSTERS, None),
        ("401 invalid", CLUSTERS, Some("mpg_not_a_key")),
        ("400", "/api/v1/clusters", key),
        ("404", "/api/v1/clusters?organization_id=globex", key),
        ("403", CLUSTERS, Some(write_only.as_str())),
    ] {
        let get = raw_request(&w, "GET", target, token).await;
        let head = raw_request(&w, "HEAD", target, token).await;
        assert_eq!(head.status.to_string(), what[..3], "{what}: {head:?}");
        assert_head_is_get_without_body(&head, &get, what);
    }
    assert_eq!(w.up.count(), 2, "a refused HEAD reached the upstream");

    // HEAD spends the route's tokens: three HEADs empty the bucket of 3,
    // and the GET after them is refused.
    let limited = "/api/v1/limited?organization_id=acme";
    for remaining in ["2", "1", "0"] {
        let head = raw_request(&w, "HEAD", limited, key).await;
        assert_eq!(head.status, 200, "{head:?}");
        assert_eq!(head.header("x-ratelimit-remaining"), Some(remaining));
        assert_eq!(head.body, "");
    }
    let head = raw_request(&w, "HEAD", limited, key).await;
    let get = raw_request(&w, "GET", limited, key).await;
    assert_eq!(get.status, 429);
    assert_head_is_get_without_body(&head, &get, "429");
    assert!(head.header("retry-after").is_some());
    assert_eq!(w.up.count(), 5);
}

#[tokio::test]
async fn head_over_http2_has_the_get_answers_fields_and_no_data() {
    let w = world(|_| {}).await;
    let mut h2 = common::h2c::connect(w.gw.addr).await;
    let request = |method: &str, target: &str, token: Option<&str>| {
        let mut req = common::h2c::request(w.gw.addr, method, target);
        if let Some(t) = token {
            req.headers_mut()
                .insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        req
    };
    let key = Some(w.seed.key.as_str());
    for (target, token, status) in [
        ("/api/v1/busy?organization_id=acme", key, 409),
        (CLUSTERS, None, 401),
        ("/api/v1/clusters", key, 400),
    ] {
        let get = h2.send(request("GET", target, token)).await.unwrap();
        let head = h2.send(request("HEAD", target, token)).await.unwrap();
        assert_eq!((get.status, head.status), (status, status), "{target}");
        assert!(
            head.ended_with_headers && head.body.is_empty(),
            "{target}: {head:?}"
        );
        assert!(!get.body.is_empty(), "{target}");
        assert_eq!(
            head.headers["content-length"],
            get.body.len().to_string(),
            "{target}"
        );
        let fields = |h: &http::HeaderMap| {
            comparable(h.iter().map(|(n, v)| (n.as_str(), v.to_str().unwrap())))
        };
        assert_eq!(fields(&head.headers), fields(&get.headers), "{target}");
    }
    assert_eq!(w.up.last().method, "HEAD");
    // The connection goes on after them.
    let res = h2.send(request("GET", CLUSTERS, key)).await.unwrap();
    assert_eq!(res.status, 200);
    assert_eq!(res.json()["method"], "GET");
}

#[tokio::test]
async fn head_on_the_key_services_get_routes_is_its_get_answer_without_a_body() {
    let w = world(|_| {}).await;
    let session = Some(w.seed.session.as_str());
    let one = format!("/api/v1/api-keys/{}", w.seed.key_id);
    let mut h2 = common::h2c::connect(w.gw.addr).await;
    for target in ["/api/v1/api-keys?organization_id=acme", one.as_str()] {
        let get = raw_request(&w, "GET", target, session).await;
        assert_eq!(get.status, 200, "{get:?}");
        assert_eq!(get.header("content-type"), Some("application/json"));
        let head = raw_request(&w, "HEAD", target, session).await;
        assert_head_is_get_without_body(&head, &get, target);
        let mut req = common::h2c::request(w.gw.addr, "HEAD", target);
        req.headers_mut().insert(
            "authorization",
            format!("Bearer {}", w.seed.session).parse().unwrap(),
        );
        let head = h2.send(req).await.unwrap();
        assert_eq!(head.status, 200, "{head:?}");
        assert!(head.ended_with_headers && head.body.is_empty(), "{head:?}");
        assert_eq!(head.headers["content-length"], get.body.len().to_string());
        assert_eq!(head.headers["content-type"], "application/json");
    }
    // An API key on the session route: 401, as for the GET.
    let head = raw_request(&w, "HEAD", &one, Some(&w.seed.key)).await;
    let get = raw_request(&w, "GET", &one, Some(&w.seed.key)).await;
    assert_eq!(head.status, 401);
    assert_head_is_get_without_body(&head, &get, "wrong credential type");
    // The POST-only revoke route: 405 naming POST alone, no body.
    let head = raw_request(&w, "HEAD", &format!("{one}/revoke"), session).await;
    assert_eq!(head.status, 405, "{head:?}");
    assert_eq!(head.header("allow"), Some("POST"));
    assert_eq!(head.body, "");
    // PUT on the key's path: Allow lists HEAD beside GET.
    let put = raw_request(&w, "PUT", &one, session).await;
    assert_eq!(put.status, 405, "{put:?}");
    assert_eq!(put.header("allow"), Some("GET, HEAD, DELETE, PATCH"));
}
