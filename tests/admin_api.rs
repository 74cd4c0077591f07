//! The admin API (`/admin/v1` on the admin listener) over HTTP, on both
//! stores: admin tokens from `mpg-gateway admin-tokens`, organizations,
//! users, memberships and sessions, and a session it hands out working on
//! the gateway's own routes until the API revokes it.
mod common;

use common::admin::{acme_with_alice, admin_api as world, call, status_of};
use common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

on_both_stores!(
    tokens_are_shown_once_checked_on_every_request_and_revoked_at_once,
    a_dashboard_backend_provisions_an_organization_and_signs_its_user_in,
    bad_input_is_a_400_naming_the_field,
    organization_limits_are_set_listed_applied_and_removed,
);

async fn tokens_are_shown_once_checked_on_every_request_and_revoked_at_once(pg: bool) {
    use reqwest::Method;
    let w = world(pg).await;
    assert!(
        w.token.starts_with("mpga_") && w.token.len() == 43,
        "{}",
        w.token
    );
    let listed = cli_ok(&w.path, &["admin-tokens", "list"]);
    let data = listed["data"].as_array().unwrap();
    assert_eq!(data.len(), 1, "{listed}");
    assert_eq!(data[0]["name"], "provisioner");
    assert!(!listed.to_string().contains("mpga_"), "{listed}");
    let id = data[0]["id"].as_str().unwrap().to_string();

    // No token, a malformed one, an API key, an unknown token: 401, the
    // seed's JSON body.
    let (forged, _) = {
        let made = cli_ok(&w.path, &["admin-tokens", "create", "--name", "other"]);
        let t = made["token"].as_str().unwrap().to_string();
        cli_ok(
            &w.path,
            &["admin-tokens", "revoke", made["id"].as_str().unwrap()],
        );
        (t, ())
    };
    let seed = seed(&w.path, "acme", "alice", "owner", "clusters:read");
    for (token, reason) in [
        (None, "missing"),
        (Some("mpga_nope"), "malformed"),
        (Some(seed.key.as_str()), "malformed"),
        (Some(forged.as_str()), "invalid"),
    ] {
        let res = client().get(format!("http://{}/admin/v1/users", w.admin));
        let res = match token {
            Some(t) => res.bearer_auth(t),
            None => res,
        };
        let res = res.send().await.unwrap();
        assert_eq!(res.status(), 401, "{token:?}");
        assert_eq!(res.headers()["www-authenticate"], "Bearer");
        let body: Value = res.json().await.unwrap();
        assert_eq!(body["error"], "Unauthorized");
        assert_eq!(body["details"]["reason"], reason, "{token:?}");
    }
    let (status, _) = call(&w, Method::GET, "/admin/v1/users", Some(&w.token), None).await;
    assert_eq!(status, 200);
    // Health stays open.
    let res = client()
        .get(format!("http://{}/healthz", w.admin))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    // Revoked from the command line: refused on the very next request.
    cli_ok(&w.path, &["admin-tokens", "revoke", &id]);
    let (status, body) = call(&w, Method::GET, "/admin/v1/users", Some(&w.token), None).await;
    assert_eq!(status, 401, "{body}");
    let log = w.gw.log_text();
    assert!(!log.contains(&w.token), "the admin token reached the log");
}

async fn a_dashboard_backend_provisions_an_organization_and_signs_its_user_in(pg: bool) {
    use reqwest::Method;
    let w = world(pg).await;
    let t = Some(w.token.as_str());
    let (status, org) = call(
        &w,
        Method::POST,
        "/admin/v1/organizations",
        t,
        Some(json!({"id": "acme", "name": "Acme"})),
    )
    .await;
    assert_eq!(status, 201, "{org}");
    assert_eq!(org["id"], "acme");
    assert_eq!(
        status_of(
            &w,
            Method::POST,
            "/admin/v1/organizations",
            Some(json!({"id": "acme"}))
        )
        .await,
        409
    );
    for user in ["alice", "bob", "carol"] {
        let (status, body) = call(
            &w,
            Method::POST,
            "/admin/v1/users",
            t,
            Some(json!({"id": user, "email": format!("{user}@acme.example")})),
        )
        .await;
        assert_eq!(status, 201, "{body}");
    }
    let (status, member) = call(
        &w,
        Method::PUT,
        "/admin/v1/organizations/acme/members/alice",
        t,
        Some(json!({"role": "owner"})),
    )
    .await;
    assert_eq!(status, 200, "{member}");
    // Two users a page: the cursor walks every user once.
    let mut seen = Vec::new();
    let mut target = "/admin/v1/users?limit=2".to_string();
    loop {
        let (status, page) = call(&w, Method::GET, &target, t, None).await;
        assert_eq!(status, 200, "{page}");
        seen.extend(
            page["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|u| u["id"].clone()),
        );
        match page["next_cursor"].as_str() {
            Some(c) => target = format!("/admin/v1/users?limit=2&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(seen, [json!("alice"), json!("bob"), json!("carol")]);
    let (status, members) = call(
        &w,
        Method::GET,
        "/admin/v1/organizations/acme/members",
        t,
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        members["data"],
        json!([{"organization_id": "acme", "user_id": "alice", "role": "owner"}])
    );

    // The backend signs alice in: the session works on the gateway's routes.
    let (status, session) = call(
        &w,
        Method::POST,
        "/admin/v1/sessions",
        t,
        Some(json!({"user_id": "alice", "ttl_seconds": 3600})),
    )
    .await;
    assert_eq!(status, 201, "{session}");
    let token = session["token"].as_str().unwrap().to_string();
    assert!(token.starts_with("mps_"));
    let keys = |token: String| {
        let url = w.gw.url("/api/v1/api-keys?organization_id=acme");
        async move {
            client()
                .get(url)
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(keys(token.clone()).await, 200);
    let (status, listed) = call(&w, Method::GET, "/admin/v1/users/alice/sessions", t, None).await;
    assert_eq!(status, 200);
    assert_eq!(listed["data"][0]["id"], session["id"]);
    assert!(!listed.to_string().contains(&token), "{listed}");
    // Revoked through the API: refused within a second.
    let id = session["id"].as_str().unwrap();
    assert_eq!(
        status_of(
            &w,
            Method::DELETE,
            &format!("/admin/v1/sessions/{id}"),
            None
        )
        .await,
        204
    );
    let deadline = Instant::now() + Duration::from_secs(1);
    while keys(token.clone()).await != 401 {
        assert!(Instant::now() < deadline, "the revoked session still works");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Removing the membership and the organization.
    assert_eq!(
        status_of(
            &w,
            Method::DELETE,
            "/admin/v1/organizations/acme/members/alice",
            None
        )
        .await,
        204
    );
    assert_eq!(
        status_of(
            &w,
            Method::DELETE,
            "/admin/v1/organizations/acme/members/alice",
            None
        )
        .await,
        404
    );
    assert_eq!(
        status_of(&w, Method::DELETE, "/admin/v1/organizations/acme", None).await,
        204
    );
    assert_eq!(
        status_of(&w, Method::GET, "/admin/v1/organizations/acme", None).await,
        404
    );
    let orgs = cli_ok(&w.path, &["orgs", "list"]);
    assert_eq!(orgs["data"], json!([]), "{orgs}");

    // Every change is in the organization's audit trail, the admin token
    // its actor; the trail outlives the organization.
    let tokens = cli_ok(&w.path, &["admin-tokens", "list"]);
    let token_id = tokens["data"][0]["id"].clone();
    let trail = cli_ok(&w.path, &["audit", "list", "--org", "acme"]);
    let events: Vec<(&str, &Value)> = trail["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["action"].as_str().unwrap(), &e["subject"]))
        .collect();
    let (alice, sid, none) = (json!("alice"), session["id"].clone(), Value::Null);
    assert_eq!(
        events,
        [
            ("organization.deleted", &none),
            ("member.removed", &alice),
            ("session.revoked", &sid),
            ("session.created", &sid),
            ("member.added", &alice),
            ("organization.created", &none),
        ],
        "{trail}"
    );
    for event in trail["data"].as_array().unwrap() {
        assert_eq!(event["actor"], token_id, "{event}");
        assert_eq!(event["client"], "127.0.0.1", "{event}");
    }
}

async fn bad_input_is_a_400_naming_the_field(pg: bool) {
    use reqwest::Method;
    let w = world(pg).await;
    let t = Some(w.token.as_str());
    call(
        &w,
        Method::POST,
        "/admin/v1/users",
        t,
        Some(json!({"id": "alice"})),
    )
    .await;
    call(
        &w,
        Method::POST,
        "/admin/v1/organizations",
        t,
        Some(json!({"id": "acme"})),
    )
    .await;
    for (method, path, body, field) in [
        (
            Method::POST,
            "/admin/v1/organizations",
            json!({"name": "x"}),
            "id",
        ),
        (
            Method::POST,
            "/admin/v1/organizations",
            json!({"id": 7}),
            "id",
        ),
        (
            Method::POST,
            "/admin/v1/users",
            json!({"id": "u", "admin": true}),
            "admin",
        ),
        // A credential pasted into an id would be forwarded and logged with it.
        (
            Method::POST,
            "/admin/v1/organizations",
            json!({"id": format!("org-{}", w.token)}),
            "id",
        ),
        (Method::POST, "/admin/v1/users", json!(["u"]), "body"),
        (
            Method::PUT,
            "/admin/v1/organizations/acme/members/alice",
            json!({"role": "wizard"}),
            "role",
        ),
        (
            Method::POST,
            "/admin/v1/sessions",
            json!({"user_id": "alice", "ttl_seconds": 0}),
            "ttl_seconds",
        ),
        (
            Method::POST,
            "/admin/v1/sessions",
            json!({"user_id": "alice", "ttl_seconds": "1h"}),
            "ttl_seconds",
        ),
        (
            Method::POST,
            "/admin/v1/sessions",
            json!({"ttl_seconds": 60}),
            "user_id",
        ),
        (Method::GET, "/admin/v1/users?limit=0", Value::Null, "limit"),
    ] {
        let body = (!body.is_null()).then_some(body);
        let (status, res) = call(&w, method.clone(), path, t, body).await;
        assert_eq!(status, 400, "{method} {path}: {res}");
        assert_eq!(res["details"]["field"], field, "{method} {path}: {res}");
        assert!(res["message"].as_str().unwrap().contains(field), "{res}");
        assert!(!res.to_string().contains("mpga_"), "{res}");
    }
    let res = client()
        .post(format!("http://{}/admin/v1/users", w.admin))
        .bearer_auth(&w.token)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
    // Unknown things are 404; a path served for other methods is 405 with Allow.
    assert_eq!(
        status_of(
            &w,
            Method::POST,
            "/admin/v1/sessions",
            Some(json!({"user_id": "nobody"}))
        )
        .await,
        404
    );
    assert_eq!(
        status_of(&w, Method::GET, "/admin/v1/users/nobody/sessions", None).await,
        404
    );
    assert_eq!(
        status_of(&w, Method::GET, "/admin/v1/nothing", None).await,
        404
    );
    let res = client()
        .patch(format!("http://{}/admin/v1/users", w.admin))
        .bearer_auth(&w.token)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 405);
    assert_eq!(res.headers()["allow"], "GET, POST");
}

async fn organization_limits_are_set_listed_applied_and_removed(pg: bool) {
    use reqwest::Method;
    let w = world(pg).await;
    let t = Some(w.token.as_str());
    let seed = seed(&w.path, "acme", "alice", "owner", "clusters:read");
    let path = "/admin/v1/organizations/acme/limits/default";
    let (status, set) = call(
        &w,
        Method::PUT,
        path,
        t,
        Some(json!({"requests": 7, "per": "1m"})),
    )
    .await;
    assert_eq!(status, 200, "{set}");
    assert_eq!(set["requests"], 7);
    let (status, listed) = call(
        &w,
        Method::GET,
        "/admin/v1/organizations/acme/limits",
        t,
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(listed["data"][0]["policy"], "default", "{listed}");
    // The organization's requests get its limit.
    let limit = || async {
        let res = client()
            .get(w.gw.url("/api/v1/clusters?organization_id=acme"))
            .bearer_auth(&seed.key)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        res.headers()["x-ratelimit-limit"]
            .to_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(limit().await, "7");
    for (body, field) in [
        (json!({"requests": 0, "per": "1m"}), "requests"),
        (json!({"requests": 5, "per": "soon"}), "per"),
        (json!({"requests": "5", "per": "1m"}), "requests"),
    ] {
        let (status, res) = call(&w, Method::PUT, path, t, Some(body.clone())).await;
        assert_eq!(status, 400, "{body}: {res}");
        assert_eq!(res["details"]["field"], field, "{body}: {res}");
    }
    let (status, res) = call(
        &w,
        Method::PUT,
        "/admin/v1/organizations/acme/limits/nope",
        t,
        Some(json!({"requests": 5, "per": "1m"})),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(res["details"]["field"], "policy");
    assert_eq!(
        status_of(
            &w,
            Method::PUT,
            "/admin/v1/organizations/globex/limits/default",
            Some(json!({"requests": 5, "per": "1m"}))
        )
        .await,
        404
    );
    assert_eq!(status_of(&w, Method::DELETE, path, None).await, 204);
    assert_eq!(status_of(&w, Method::DELETE, path, None).await, 404);
}

/// Two instances on one PostgreSQL store: what the admin API of one changes
/// (a membership, a session) reaches the other's cached answers within 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_through_one_instance_reaches_the_other_within_one_second() {
    use reqwest::Method;
    let w = world(true).await;
    let t = Some(w.token.as_str());
    // A second instance, caching for an hour: only the change log can tell it.
    let mut cfg = TestConfig::new(w.up.addr);
    cfg.postgres(&w.db.as_ref().unwrap().url);
    cfg.set("store.cache_ttl", "1h");
    let other = Gateway::start(&cfg.write());
    acme_with_alice(&w).await;
    let (_, session) = call(
        &w,
        Method::POST,
        "/admin/v1/sessions",
        t,
        Some(json!({"user_id": "alice"})),
    )
    .await;
    let token = session["token"].as_str().unwrap().to_string();
    let status_on_other = || {
        let (url, token) = (
            other.url("/api/v1/api-keys?organization_id=acme"),
            token.clone(),
        );
        async move {
            client()
                .get(url)
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(status_on_other().await, 200);
    let within_a_second = |want: u16| async move {
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            let got = status_on_other().await;
            if got == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "still {got}, not {want}, after 1 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    // The membership goes: the other instance answers 404 (not a member).
    assert_eq!(
        status_of(
            &w,
            Method::DELETE,
            "/admin/v1/organizations/acme/members/alice",
            None
        )
        .await,
        204
    );
    within_a_second(404).await;
    // It comes back, then the session goes: 401.
    call(
        &w,
        Method::PUT,
        "/admin/v1/organizations/acme/members/alice",
        t,
        Some(json!({"role": "owner"})),
    )
    .await;
    within_a_second(200).await;
    let id = session["id"].as_str().unwrap();
    assert_eq!(
        status_of(
            &w,
            Method::DELETE,
            &format!("/admin/v1/sessions/{id}"),
            None
        )
        .await,
        204
    );
    within_a_second(401).await;
}

#[tokio::test]
async fn the_admin_listener_serves_tls_with_its_own_certificate() {
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    let (cert, key) = mpg_gateway::tls::self_signed_pem().unwrap();
    let (cert_path, key_path) = (
        cfg.dir.path().join("admin.pem"),
        cfg.dir.path().join("admin.key"),
    );
    std::fs::write(&cert_path, cert).unwrap();
    std::fs::write(&key_path, key).unwrap();
    cfg.set("admin.enabled", true);
    cfg.set("admin.listen", "127.0.0.1:0");
    cfg.set("admin.tls.cert", cert_path.to_str().unwrap());
    cfg.set("admin.tls.key", key_path.to_str().unwrap());
    let path = cfg.write();
    let made = cli_ok(&path, &["admin-tokens", "create", "--name", "tls"]);
    let token = made["token"].as_str().unwrap();
    let gw = Gateway::start(&path);
    let admin = gw.admin.unwrap();
    let tls_client = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap();
    let res = tls_client
        .get(format!("https://localhost:{}/admin/v1/users", admin.port()))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    // Plain HTTP gets no answer from a TLS listener.
    let plain = client()
        .get(format!("http://{admin}/admin/v1/users"))
        .bearer_auth(token)
        .send()
        .await;
    assert!(plain.is_err() || !plain.unwrap().status().is_success());

    // A file that is missing is named by check-config; so is a listener
    // open to other hosts without TLS, as a warning.
    cfg.set("admin.tls.key", "/nonexistent/admin.key");
    let (code, _, err) = cli(&cfg.write(), &["check-config"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("admin.tls.key"), "{err}");
    cfg.remove("admin.tls");
    cfg.set("admin.listen", "0.0.0.0:0");
    let (code, _, err) = cli(&cfg.write(), &["check-config"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("warning: admin.listen = \"0.0.0.0:0\" is not a loopback address"),
        "{err}"
    );
}
