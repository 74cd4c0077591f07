//! The admin API's read-only views of the running gateway, behind the admin
//! token: `/admin/v1/status` (version, uptime, the configuration's file and
//! its last reload, readiness, and the data plane's request counters),
//! `/admin/v1/routes` as configured, and `/admin/v1/upstreams` with each
//! target's state, out of rotation once its upstream stops answering.
mod common;

use common::*;
use reqwest::Method;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// A gateway with the admin API, the shipped routes, and a route `/dead`
/// to an upstream whose only target refuses connections.
struct Views {
    _up: MockUpstream,
    cfg: TestConfig,
    path: std::path::PathBuf,
    gw: Gateway,
    admin: std::net::SocketAddr,
    token: String,
}

async fn views() -> Views {
    let up = MockUpstream::start().await;
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let mut cfg = TestConfig::new(up.addr);
    cfg.set("admin.enabled", true);
    cfg.set("admin.listen", "127.0.0.1:0");
    cfg.set("upstreams.dead.targets", vec![format!("http://{dead}")]);
    cfg.set("upstreams.dead.max_fails", 2);
    cfg.route("method = \"GET\"\npath = \"/dead\"\nauth = \"none\"\nupstream = \"dead\"");
    let path = cfg.write();
    let token = cli_ok(&path, &["admin-tokens", "create", "--name", "console"])["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let gw = Gateway::start(&path);
    let admin = gw.admin.expect("admin listener address logged");
    Views {
        _up: up,
        cfg,
        path,
        gw,
        admin,
        token,
    }
}

async fn get(v: &Views, path: &str, token: Option<&str>) -> (u16, Value) {
    let mut req = client().get(format!("http://{}{path}", v.admin));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let res = req.send().await.unwrap();
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

async fn reload(v: &Views) -> u16 {
    let url = format!("http://{}/reload", v.admin);
    let res = client().post(url).send().await.unwrap();
    res.status().as_u16()
}

#[tokio::test]
async fn status_shows_the_version_the_configuration_readiness_and_the_requests() {
    let v = views().await;
    let t = Some(v.token.as_str());
    let (status, s) = get(&v, "/admin/v1/status", t).await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["version"], env!("CARGO_PKG_VERSION"));
    assert!(s["uptime_seconds"].as_i64().unwrap() >= 0, "{s}");
    assert_eq!(s["config"]["path"], v.path.display().to_string());
    assert_eq!(s["config"]["last_reload"], Value::Null);
    assert_eq!(s["store"], "ok");
    assert_eq!(s["rate_limiter"]["backend"], "local");
    assert_eq!(s["rate_limiter"]["instances"], 1);
    assert_eq!(
        s["roles"],
        json!(["admin", "member", "owner", "viewer"]),
        "{s}"
    );
    assert!(s["scopes"]
        .as_array()
        .unwrap()
        .contains(&json!("clusters:read")));
    let before = s["requests"]["total"].as_u64().unwrap();

    // Three requests through the data plane: two 401s and a 502.
    for _ in 0..2 {
        let res = client().get(v.gw.url("/api/v1/clusters?organization_id=acme"));
        assert_eq!(res.send().await.unwrap().status(), 401);
    }
    let res = client().get(v.gw.url("/dead")).send().await.unwrap();
    assert_eq!(res.status(), 502);
    let (_, s) = get(&v, "/admin/v1/status", t).await;
    let r = &s["requests"];
    assert_eq!(r["total"].as_u64().unwrap(), before + 3, "{s}");
    assert_eq!(r["by_class"]["4xx"], 2, "{s}");
    assert_eq!(r["by_class"]["5xx"], 1, "{s}");
    let buckets = r["duration_buckets"].as_array().unwrap();
    assert_eq!(buckets.last().unwrap(), &json!([null, before + 3]), "{s}");

    // A reload, then one the file refuses: both shown with their outcome.
    assert_eq!(reload(&v).await, 200);
    let (_, s) = get(&v, "/admin/v1/status", t).await;
    let last = &s["config"]["last_reload"];
    assert_eq!(last["outcome"], "reloaded", "{s}");
    assert_eq!(last["problems"], json!([]));
    std::fs::write(&v.path, "[server\n").unwrap();
    assert_eq!(reload(&v).await, 400);
    let (_, s) = get(&v, "/admin/v1/status", t).await;
    let last = &s["config"]["last_reload"];
    assert_eq!(last["outcome"], "failed", "{s}");
    assert!(!last["problems"].as_array().unwrap().is_empty(), "{s}");
    v.cfg.write();
}

#[tokio::test]
async fn routes_and_upstreams_are_listed_and_a_dead_target_leaves_rotation() {
    let v = views().await;
    let t = Some(v.token.as_str());
    let (status, routes) = get(&v, "/admin/v1/routes", t).await;
    assert_eq!(status, 200, "{routes}");
    let data = routes["data"].as_array().unwrap();
    let clusters = data
        .iter()
        .find(|r| r["path"] == "/api/v1/clusters" && r["method"] == "GET")
        .expect("the clusters route");
    assert_eq!(clusters["auth"], "api_key");
    assert_eq!(clusters["scope"], "clusters:read");
    assert_eq!(clusters["upstream"], "clusters");
    assert_eq!(clusters["cost"], 1);
    let dead = data.iter().find(|r| r["path"] == "/dead").unwrap();
    assert_eq!(dead["auth"], "none");
    assert_eq!(routes["next_cursor"], Value::Null);

    let state = |ups: &Value, name: &str| {
        let up = (ups["data"].as_array().unwrap().iter())
            .find(|u| u["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no upstream {name}: {ups}"));
        up
    };
    let (status, ups) = get(&v, "/admin/v1/upstreams", t).await;
    assert_eq!(status, 200, "{ups}");
    assert_eq!(state(&ups, "api-keys")["builtin"], true);
    let clusters = state(&ups, "clusters");
    assert_eq!(clusters["builtin"], false);
    assert_eq!(clusters["targets"][0]["state"], "in_rotation", "{ups}");
    assert_eq!(state(&ups, "dead")["targets"][0]["state"], "in_rotation");
    // Two failures in a row: out of rotation, with the last error shown.
    for _ in 0..2 {
        let res = client().get(v.gw.url("/dead")).send().await.unwrap();
        assert_eq!(res.status(), 502);
    }
    let (_, ups) = get(&v, "/admin/v1/upstreams", t).await;
    let target = &state(&ups, "dead")["targets"][0];
    assert_eq!(target["state"], "ejected", "{ups}");
    assert_eq!(target["failures"], 2, "{ups}");
    assert_eq!(target["in_flight"], 0, "{ups}");
    assert!(target["last_error"].is_string(), "{ups}");
    // Once its back-off is over, a request may probe it.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let (_, ups) = get(&v, "/admin/v1/upstreams", t).await;
        if state(&ups, "dead")["targets"][0]["state"] == "probing" {
            break;
        }
        assert!(Instant::now() < deadline, "never probing: {ups}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn the_views_need_the_admin_token_and_are_read_only() {
    let v = views().await;
    for path in [
        "/admin/v1/status",
        "/admin/v1/routes",
        "/admin/v1/upstreams",
    ] {
        let (status, body) = get(&v, path, None).await;
        assert_eq!(status, 401, "{path}: {body}");
        assert_eq!(body["details"]["reason"], "missing");
        let (status, _) = get(&v, path, Some("mpga_nope")).await;
        assert_eq!(status, 401, "{path}");
        let res = client()
            .request(Method::POST, format!("http://{}{path}", v.admin))
            .bearer_auth(&v.token)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 405, "{path}");
        assert_eq!(res.headers()["allow"], "GET");
    }
    // Revoked: refused on the next request.
    let listed = cli_ok(&v.path, &["admin-tokens", "list"]);
    let id = listed["data"][0]["id"].as_str().unwrap().to_owned();
    cli_ok(&v.path, &["admin-tokens", "revoke", &id]);
    let (status, _) = get(&v, "/admin/v1/status", Some(&v.token)).await;
    assert_eq!(status, 401);
}
