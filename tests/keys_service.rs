//! The built-in API key service over HTTP, every case on both stores:
//! `sqlite::…` on the embedded one, `postgres::…` on a database of its own.
mod common;

use common::scale::PgDb;
use common::*;
use serde_json::{json, Value};

struct World {
    _up: MockUpstream,
    _cfg: TestConfig,
    path: std::path::PathBuf,
    gw: Gateway,
    seed: Seed,
    /// Dropped last, after the gateway.
    _db: Option<PgDb>,
}

/// The gateway on SQLite, or on PostgreSQL when `pg`.
async fn world(pg: bool) -> World {
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    let db = if pg { Some(PgDb::create().await) } else { None };
    if let Some(db) = &db {
        cfg.postgres(&db.url);
    }
    cfg.set(
        "roles.keymaster",
        vec!["api-keys:read".to_string(), "api-keys:write".to_string()],
    );
    let path = cfg.write();
    let seed = seed(&path, "acme", "alice", "owner", "clusters:read");
    let gw = Gateway::start(&path);
    World {
        _up: up,
        _cfg: cfg,
        path,
        gw,
        seed,
        _db: db,
    }
}

async fn call(
    w: &World,
    method: reqwest::Method,
    target: &str,
    token: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let req = client()
        .request(method, w.gw.url(target))
        .bearer_auth(token);
    exchange(req, body).await
}

const KEYS: &str = "/api/v1/api-keys?organization_id=acme";

on_both_stores!(
    the_whole_lifecycle_works_and_the_secret_is_shown_once,
    pagination_walks_every_key_once,
    validation_names_the_field,
    scopes_beyond_the_role_are_forbidden_and_other_organizations_keys_are_not_found,
    only_the_keys_own_user_may_rotate_it,
    rotation_gives_a_new_key_and_the_old_one_works_for_the_grace_period,
    rotation_without_grace_ends_the_old_key_at_once_and_refuses_a_dead_key,
    rotation_validation_names_the_field,
    the_key_lifecycle_is_audited_newest_first_without_secrets,
    audit_ids_and_cursors_tell_nothing_of_other_organizations,
    patch_changes_only_the_fields_named_and_audits_their_names,
);

async fn the_whole_lifecycle_works_and_the_secret_is_shown_once(pg: bool) {
    let w = world(pg).await;
    let s = &w.seed.session;
    let (status, created) =
        call(&w, reqwest::Method::POST, KEYS, s, Some(json!({"name": "ci", "scopes": ["clusters:read"], "expires_at": "2999-01-01T00:00:00Z"}))).await;
    assert_eq!(status, 201, "{created}");
    let secret = created["key"].as_str().unwrap().to_string();
    assert!(secret.starts_with("mpg_") && secret.len() == 42, "{secret}");
    let id = created["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("key_"));
    assert_eq!(created["status"], "active");
    assert_eq!(created["organization_id"], "acme");
    assert_eq!(created["user_id"], "alice");
    assert_eq!(created["scopes"], json!(["clusters:read"]));
    assert_eq!(created["prefix"], &secret[4..12]);
    assert_eq!(created["expires_at"], "2999-01-01T00:00:00Z");
    for field in ["created_at", "revoked_at", "last_used_at", "name"] {
        assert!(created.get(field).is_some(), "missing {field}");
    }

    // The new key works on the clusters route.
    let res = client()
        .get(w.gw.url("/api/v1/clusters?organization_id=acme"))
        .bearer_auth(&secret)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);

    let (status, got) = call(
        &w,
        reqwest::Method::GET,
        &format!("/api/v1/api-keys/{id}"),
        s,
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(got["id"], id.as_str());
    assert!(got.get("key").is_none(), "the secret was shown again");

    let (status, list) = call(&w, reqwest::Method::GET, KEYS, s, None).await;
    assert_eq!(status, 200);
    assert_eq!(list["data"].as_array().unwrap().len(), 2);
    assert!(list["next_cursor"].is_null());
    assert!(!list.to_string().contains(&secret));

    let (status, revoked) = call(
        &w,
        reqwest::Method::POST,
        &format!("/api/v1/api-keys/{id}/revoke"),
        s,
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(revoked["status"], "revoked");
    let first_revoked_at = revoked["revoked_at"].clone();
    assert!(first_revoked_at.is_string());
    // Seen at once in this process.
    let res = client()
        .get(w.gw.url("/api/v1/clusters?organization_id=acme"))
        .bearer_auth(&secret)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401);
    let (status, again) = call(
        &w,
        reqwest::Method::POST,
        &format!("/api/v1/api-keys/{id}/revoke"),
        s,
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(again["revoked_at"], first_revoked_at);

    let res = client()
        .delete(w.gw.url(&format!("/api/v1/api-keys/{id}")))
        .bearer_auth(s)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 204);
    let (status, _) = call(
        &w,
        reqwest::Method::GET,
        &format!("/api/v1/api-keys/{id}"),
        s,
        None,
    )
    .await;
    assert_eq!(status, 404);
}

async fn pagination_walks_every_key_once(pg: bool) {
    let w = world(pg).await;
    for i in 0..5 {
        let (status, _) = call(
            &w,
            reqwest::Method::POST,
            KEYS,
            &w.seed.session,
            Some(json!({"name": format!("k{i}"), "scopes": ["clusters:read"]})),
        )
        .await;
        assert_eq!(status, 201);
    }
    let mut ids = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let target = match &cursor {
            Some(c) => format!("{KEYS}&limit=2&cursor={c}"),
            None => format!("{KEYS}&limit=2"),
        };
        let (status, page) = call(&w, reqwest::Method::GET, &target, &w.seed.session, None).await;
        assert_eq!(status, 200, "{page}");
        let data = page["data"].as_array().unwrap();
        assert!(data.len() <= 2);
        ids.extend(data.iter().map(|r| r["id"].as_str().unwrap().to_string()));
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!((ids.len(), unique.len()), (6, 6), "{ids:?}");
    let (status, body) = call(
        &w,
        reqwest::Method::GET,
        &format!("{KEYS}&limit=0"),
        &w.seed.session,
        None,
    )
    .await;
    assert_eq!(
        (status, body["details"]["field"].as_str()),
        (400, Some("limit"))
    );
    let (status, body) = call(
        &w,
        reqwest::Method::GET,
        &format!("{KEYS}&cursor=garbage"),
        &w.seed.session,
        None,
    )
    .await;
    assert_eq!(
        (status, body["details"]["field"].as_str()),
        (400, Some("cursor"))
    );
}

async fn validation_names_the_field(pg: bool) {
    let w = world(pg).await;
    let s = &w.seed.session;
    let cases = [
        (json!({"scopes": ["clusters:read"]}), "name"),
        (json!({"name": "", "scopes": ["clusters:read"]}), "name"),
        (
            json!({"name": "x".repeat(101), "scopes": ["clusters:read"]}),
            "name",
        ),
        (json!({"name": "a"}), "scopes"),
        (json!({"name": "a", "scopes": []}), "scopes"),
        (
            json!({"name": "a", "scopes": ["clusters:destroy"]}),
            "scopes",
        ),
        (
            json!({"name": "a", "scopes": ["clusters:read"], "expires_at": "next week"}),
            "expires_at",
        ),
        (
            json!({"name": "a", "scopes": ["clusters:read"], "expires_at": "2001-01-01T00:00:00Z"}),
            "expires_at",
        ),
        (json!(["not", "an", "object"]), "body"),
    ];
    for (body, field) in cases {
        let (status, res) = call(&w, reqwest::Method::POST, KEYS, s, Some(body.clone())).await;
        assert_eq!(status, 400, "{body}: {res}");
        assert_eq!(res["details"]["field"], field, "{body}: {res}");
        assert!(res["message"].as_str().unwrap().contains(field), "{res}");
    }
    let res = client()
        .post(w.gw.url(KEYS))
        .bearer_auth(s)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["details"]["field"], "body");
}

async fn scopes_beyond_the_role_are_forbidden_and_other_organizations_keys_are_not_found(pg: bool) {
    let w = world(pg).await;
    let km = seed(&w.path, "acme", "kim", "keymaster", "api-keys:read");
    let (status, body) = call(
        &w,
        reqwest::Method::POST,
        KEYS,
        &km.session,
        Some(json!({"name": "x", "scopes": ["clusters:read"]})),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["details"]["required_scope"], "clusters:read");

    let other = seed(&w.path, "globex", "gus", "owner", "clusters:read");
    for (method, target) in [
        (
            reqwest::Method::GET,
            format!("/api/v1/api-keys/{}", other.key_id),
        ),
        (
            reqwest::Method::POST,
            format!("/api/v1/api-keys/{}/revoke", other.key_id),
        ),
        (
            reqwest::Method::POST,
            format!("/api/v1/api-keys/{}/rotate", other.key_id),
        ),
        (
            reqwest::Method::DELETE,
            format!("/api/v1/api-keys/{}", other.key_id),
        ),
        (
            reqwest::Method::GET,
            "/api/v1/api-keys/key_doesnotexist000".to_string(),
        ),
        (
            reqwest::Method::GET,
            "/api/v1/api-keys?organization_id=globex".to_string(),
        ),
    ] {
        let (status, body) = call(&w, method.clone(), &target, &w.seed.session, None).await;
        assert_eq!(status, 404, "{method} {target}: {body}");
    }
    // The other organization's key was not touched.
    let got = cli_ok(&w.path, &["keys", "get", &other.key_id]);
    assert_eq!(got["status"], "active");
    assert!(got["replaced_by"].is_null(), "{got}");

    // Rotating mints a secret with the key's scopes: its owner, in a role
    // that could not create such a key (the CLI made it), cannot rotate it.
    let (_, beyond) = create_key(&w.path, "acme", "kim", "clusters:read");
    let (status, body) = call(
        &w,
        reqwest::Method::POST,
        &format!("/api/v1/api-keys/{beyond}/rotate"),
        &km.session,
        None,
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["details"]["required_scope"], "clusters:read");
}

async fn only_the_keys_own_user_may_rotate_it(pg: bool) {
    let w = world(pg).await;
    let bob = seed(&w.path, "acme", "bob", "member", "clusters:read");
    let rotate = |id: &str| format!("/api/v1/api-keys/{id}/rotate");
    // A member with `api-keys:write` asks for a new secret of the owner's key.
    let body = Some(json!({"grace_period_seconds": 0}));
    let (status, res) = call(
        &w,
        reqwest::Method::POST,
        &rotate(&w.seed.key_id),
        &bob.session,
        body.clone(),
    )
    .await;
    assert_eq!(status, 403, "{res}");
    assert_eq!(res["details"]["reason"], "not_key_owner", "{res}");
    assert!(res.get("key").is_none(), "{res}");
    // Nothing changed: the owner's key still works and has no successor.
    assert_eq!(use_key(&w.gw, &w.seed.key).await.0, 200);
    let got = cli_ok(&w.path, &["keys", "get", &w.seed.key_id]);
    assert!(got["replaced_by"].is_null(), "{got}");
    let events = cli_ok(&w.path, &["audit", "list", "--org", "acme"]);
    assert!(!events.to_string().contains("api_key.rotated"), "{events}");
    // Nor can he create a key in someone else's name.
    let (status, res) = call(
        &w,
        reqwest::Method::POST,
        KEYS,
        &bob.session,
        Some(json!({"name": "x", "scopes": ["clusters:read"], "user_id": "alice"})),
    )
    .await;
    assert_eq!(status, 400, "{res}");
    assert_eq!(res["details"]["field"], "user_id", "{res}");
    // Bob rotates his own key.
    let (status, res) = call(
        &w,
        reqwest::Method::POST,
        &rotate(&bob.key_id),
        &bob.session,
        body,
    )
    .await;
    assert_eq!(status, 201, "{res}");
    assert_eq!(res["user_id"], "bob", "{res}");
}

async fn rotation_gives_a_new_key_and_the_old_one_works_for_the_grace_period(pg: bool) {
    let w = world(pg).await;
    let s = &w.seed.session;
    let (status, old) = call(
        &w,
        reqwest::Method::POST,
        KEYS,
        s,
        Some(json!({"name": "ci", "scopes": ["clusters:read"], "expires_at": "2999-01-01T00:00:00Z"})),
    )
    .await;
    assert_eq!(status, 201, "{old}");
    let old_id = old["id"].as_str().unwrap().to_string();
    let old_secret = old["key"].as_str().unwrap().to_string();
    assert!(old["replaced_by"].is_null(), "{old}");
    assert_eq!(use_key(&w.gw, &old_secret).await.0, 200);

    let rotate = format!("/api/v1/api-keys/{old_id}/rotate");
    let before = unix_now();
    let (status, new) = call(
        &w,
        reqwest::Method::POST,
        &rotate,
        s,
        Some(json!({"grace_period_seconds": GRACE})),
    )
    .await;
    let after = unix_now();
    assert_eq!(status, 201, "{new}");
    let new_id = new["id"].as_str().unwrap().to_string();
    let new_secret = new["key"].as_str().unwrap().to_string();
    assert_ne!(new_id, old_id);
    assert!(new_secret.starts_with("mpg_") && new_secret != old_secret);
    assert_eq!(new["prefix"], &new_secret[4..12]);
    for field in ["name", "scopes", "expires_at", "organization_id", "user_id"] {
        assert_eq!(new[field], old[field], "{field}");
    }
    assert_eq!(new["status"], "active");
    assert!(new["replaced_by"].is_null(), "{new}");

    // Both keys work during the grace period.
    assert_eq!(use_key(&w.gw, &new_secret).await.0, 200);
    assert_eq!(use_key(&w.gw, &old_secret).await.0, 200);

    // The old record names its successor and its new expiry; so does the list.
    let (status, got) = call(
        &w,
        reqwest::Method::GET,
        &format!("/api/v1/api-keys/{old_id}"),
        s,
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(got["replaced_by"], new_id.as_str());
    // It ends `GRACE` seconds after the rotation.
    let ends = time::OffsetDateTime::parse(
        got["expires_at"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap()
    .unix_timestamp();
    assert!(
        (before + GRACE..=after + GRACE).contains(&ends),
        "expires_at {ends}, rotated within [{before}, {after}]"
    );
    let (_, list) = call(&w, reqwest::Method::GET, KEYS, s, None).await;
    let listed = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == old_id.as_str())
        .cloned()
        .unwrap();
    assert_eq!(listed["replaced_by"], new_id.as_str());
    assert!(!list.to_string().contains(&new_secret[4..]));

    // A key is rotated once: its successor is the one to rotate.
    let (status, body) = call(&w, reqwest::Method::POST, &rotate, s, None).await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains(&new_id),
        "{body}"
    );

    // Just before the grace period ends the old key works; just after, it
    // is expired. The new one works throughout.
    let ends = std::time::UNIX_EPOCH + std::time::Duration::from_secs(ends as u64);
    sleep_until_wall(ends - std::time::Duration::from_millis(1200)).await;
    assert_eq!(use_key(&w.gw, &old_secret).await.0, 200, "ended early");
    sleep_until_wall(ends + std::time::Duration::from_millis(200)).await;
    let (status, reason) = use_key(&w.gw, &old_secret).await;
    assert_eq!(
        (status, reason),
        (401, json!("expired")),
        "outlived its grace period"
    );
    assert_eq!(use_key(&w.gw, &new_secret).await.0, 200);
}

/// The old key's grace period in the rotation test, in seconds.
const GRACE: i64 = 3;

/// Sleeps until the wall clock reads `at` (at once if it has passed).
async fn sleep_until_wall(at: std::time::SystemTime) {
    if let Ok(left) = at.duration_since(std::time::SystemTime::now()) {
        tokio::time::sleep(left).await;
    }
}

async fn rotation_without_grace_ends_the_old_key_at_once_and_refuses_a_dead_key(pg: bool) {
    let w = world(pg).await;
    let s = &w.seed.session;
    let (status, new) = call(
        &w,
        reqwest::Method::POST,
        &format!("/api/v1/api-keys/{}/rotate", w.seed.key_id),
        s,
        None,
    )
    .await;
    assert_eq!(status, 201, "{new}");
    assert_eq!(use_key(&w.gw, &w.seed.key).await, (401, json!("expired")));
    let new_secret = new["key"].as_str().unwrap();
    assert_eq!(use_key(&w.gw, new_secret).await.0, 200);
    let (_, old) = call(
        &w,
        reqwest::Method::GET,
        &format!("/api/v1/api-keys/{}", w.seed.key_id),
        s,
        None,
    )
    .await;
    assert_eq!(old["status"], "expired");
    assert_eq!(old["replaced_by"], new["id"]);

    // An explicit 0 is the same; a revoked key cannot be rotated.
    let new_id = new["id"].as_str().unwrap();
    let (status, _) = call(
        &w,
        reqwest::Method::POST,
        &format!("/api/v1/api-keys/{new_id}/revoke"),
        s,
        None,
    )
    .await;
    assert_eq!(status, 200);
    let (status, body) = call(
        &w,
        reqwest::Method::POST,
        &format!("/api/v1/api-keys/{new_id}/rotate"),
        s,
        Some(json!({"grace_period_seconds": 0})),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("revoked"),
        "{body}"
    );
}

async fn rotation_validation_names_the_field(pg: bool) {
    let w = world(pg).await;
    let s = &w.seed.session;
    let rotate = format!("/api/v1/api-keys/{}/rotate", w.seed.key_id);
    let cases = [
        (json!({"grace_period_seconds": -1}), "grace_period_seconds"),
        (
            json!({"grace_period_seconds": 604_801}),
            "grace_period_seconds",
        ),
        (json!({"grace_period_seconds": 1.5}), "grace_period_seconds"),
        (
            json!({"grace_period_seconds": "60"}),
            "grace_period_seconds",
        ),
        (json!({"grace": 60}), "grace"),
        (json!([60]), "body"),
    ];
    for (body, field) in cases {
        let (status, res) = call(&w, reqwest::Method::POST, &rotate, s, Some(body.clone())).await;
        assert_eq!(status, 400, "{body}: {res}");
        assert_eq!(res["details"]["field"], field, "{body}: {res}");
        assert!(res["message"].as_str().unwrap().contains(field), "{res}");
    }
    // Nothing was rotated; the largest grace is accepted.
    assert_eq!(use_key(&w.gw, &w.seed.key).await.0, 200);
    let (status, res) = call(
        &w,
        reqwest::Method::POST,
        &rotate,
        s,
        Some(json!({"grace_period_seconds": 604_800})),
    )
    .await;
    assert_eq!(status, 201, "{res}");
    assert_eq!(use_key(&w.gw, &w.seed.key).await.0, 200);
}

#[tokio::test]
async fn a_credential_pasted_into_the_body_is_never_echoed_in_the_error() {
    // Secrets never appear in an error body. A session token or
    // key pasted as a scope or as a field name came back in `message` and
    // `details.field`.
    let w = world(false).await;
    let s = &w.seed.session;
    let key = &w.seed.key;
    for body in [
        json!({"name": "a", "scopes": [key]}),
        json!({"name": "a", "scopes": [s]}),
        json!({"name": "a", "scopes": ["clusters:read"], key.as_str(): true}),
    ] {
        let (status, res) = call(&w, reqwest::Method::POST, KEYS, s, Some(body)).await;
        assert_eq!(status, 400, "{res}");
        let text = res.to_string();
        assert!(
            !text.contains(&key[4..]) && !text.contains(&s[4..]),
            "{text}"
        );
        assert!(res["details"]["field"].is_string(), "{res}");
    }
}

/// `call` with an `X-Request-Id`.
async fn call_as(
    w: &World,
    method: reqwest::Method,
    target: &str,
    request_id: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let req = client()
        .request(method, w.gw.url(target))
        .bearer_auth(&w.seed.session)
        .header("x-request-id", request_id);
    exchange(req, body).await
}

const AUDIT: &str = "/api/v1/audit-events?organization_id=acme";

async fn the_key_lifecycle_is_audited_newest_first_without_secrets(pg: bool) {
    use reqwest::Method;
    let w = world(pg).await;
    let (status, created) = call_as(
        &w,
        Method::POST,
        KEYS,
        "req-create",
        Some(json!({"name": "ci", "scopes": ["clusters:read"]})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let mut secrets = vec![created["key"].as_str().unwrap().to_string()];
    let (status, rotated) = call_as(
        &w,
        Method::POST,
        &format!("/api/v1/api-keys/{id}/rotate"),
        "req-rotate",
        None,
    )
    .await;
    assert_eq!(status, 201, "{rotated}");
    let new_id = rotated["id"].as_str().unwrap().to_string();
    secrets.push(rotated["key"].as_str().unwrap().to_string());
    let (status, _) = call_as(
        &w,
        Method::POST,
        &format!("/api/v1/api-keys/{new_id}/revoke"),
        "req-revoke",
        None,
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = call_as(
        &w,
        Method::DELETE,
        &format!("/api/v1/api-keys/{new_id}"),
        "req-delete",
        None,
    )
    .await;
    assert_eq!(status, 204);

    let (status, body) = call_as(&w, Method::GET, AUDIT, "req-list", None).await;
    assert_eq!(status, 200, "{body}");
    let events = body["data"].as_array().unwrap();
    // The five API events (a rotation records the new key's creation too),
    // newest first, then what the seed made with the CLI: the key, the
    // session, the membership and the organization.
    assert_eq!(events.len(), 9, "{body}");
    assert_eq!(body["next_cursor"], Value::Null);
    let expected = [
        ("api_key.deleted", &new_id, "req-delete"),
        ("api_key.revoked", &new_id, "req-revoke"),
        ("api_key.rotated", &id, "req-rotate"),
        ("api_key.created", &new_id, "req-rotate"),
        ("api_key.created", &id, "req-create"),
    ];
    for (event, (action, key, request_id)) in events.iter().zip(expected) {
        assert_eq!(event["action"], action, "{event}");
        assert_eq!(event["key_id"], key.as_str(), "{event}");
        assert_eq!(event["organization_id"], "acme");
        assert_eq!(event["actor"], "alice");
        assert_eq!(event["request_id"], request_id);
        assert_eq!(event["client"], "127.0.0.1");
        assert!(event["id"].as_str().is_some_and(|i| !i.is_empty()));
        assert!(
            event["at"].as_str().is_some_and(|t| t.ends_with('Z')),
            "{event}"
        );
        // A rotation names its successor; no other key event has a subject.
        let (subject, fields) = match action {
            "api_key.rotated" => (json!(new_id), 10),
            _ => (Value::Null, 9),
        };
        assert_eq!(event["subject"], subject, "{event}");
        assert_eq!(
            event.get("replaced_by").cloned(),
            (fields == 10).then(|| json!(new_id)),
            "{event}"
        );
        assert_eq!(event.as_object().map(|o| o.len()), Some(fields), "{event}");
    }
    assert_eq!(events[5]["action"], "api_key.created");
    assert_eq!(events[5]["key_id"], w.seed.key_id.as_str());
    assert_eq!(events[5]["actor"], "cli");
    assert_eq!(events[5]["request_id"], Value::Null);
    assert_eq!(events[5]["client"], Value::Null);
    let seeded: Vec<(&str, &Value, &Value)> = events[6..]
        .iter()
        .map(|e| (e["action"].as_str().unwrap(), &e["key_id"], &e["actor"]))
        .collect();
    let (cli, null) = (json!("cli"), Value::Null);
    assert_eq!(
        seeded,
        [
            ("session.created", &null, &cli),
            ("member.added", &null, &cli),
            ("organization.created", &null, &cli),
        ]
    );
    assert_eq!(events[7]["subject"], "alice");
    assert!(events[6]["subject"].as_str().unwrap().starts_with("ses_"));
    let text = body.to_string();
    secrets.push(w.seed.key.clone());
    for secret in &secrets {
        assert!(
            !text.contains(secret.as_str()) && !text.contains(&secret[4..12]),
            "{text}"
        );
    }
    assert!(!text.contains("mpg_") && !text.contains("hash"), "{text}");

    // Two at a time: the cursor walks every event once, in order.
    let mut seen = Vec::new();
    let mut target = format!("{AUDIT}&limit=2");
    loop {
        let (status, page) = call_as(&w, Method::GET, &target, "req-page", None).await;
        assert_eq!(status, 200, "{page}");
        let data = page["data"].as_array().unwrap();
        assert!(data.len() <= 2);
        seen.extend(data.iter().map(|e| e["id"].clone()));
        match page["next_cursor"].as_str() {
            Some(c) => target = format!("{AUDIT}&limit=2&cursor={c}"),
            None => break,
        }
    }
    let all: Vec<Value> = events.iter().map(|e| e["id"].clone()).collect();
    assert_eq!(seen, all);
    let (status, body) = call_as(
        &w,
        Method::GET,
        &format!("{AUDIT}&cursor=nonsense"),
        "r",
        None,
    )
    .await;
    assert_eq!(status, 400, "{body}");

    // Another organization's trail is not found, as its keys are.
    let other = seed(&w.path, "globex", "gus", "owner", "clusters:read");
    let (status, body) = call_as(
        &w,
        Method::GET,
        "/api/v1/audit-events?organization_id=globex",
        "r",
        None,
    )
    .await;
    let (key_status, _) = call_as(
        &w,
        Method::GET,
        "/api/v1/api-keys?organization_id=globex",
        "r",
        None,
    )
    .await;
    assert_eq!(status, key_status, "{body}");
    assert_eq!(status, 404, "{body}");

    // The CLI's revoke is the CLI's: no user, request or client.
    cli_ok(&w.path, &["keys", "revoke", &other.key_id]);
    let listed = cli_ok(
        &w.path,
        &["audit", "list", "--org", "globex", "--limit", "1"],
    );
    let data = listed["data"].as_array().unwrap();
    assert_eq!(data.len(), 1, "{listed}");
    assert_eq!(data[0]["action"], "api_key.revoked");
    assert_eq!(data[0]["key_id"], other.key_id.as_str());
    assert_eq!(data[0]["actor"], "cli");
    assert_eq!(data[0]["request_id"], Value::Null);
    assert_eq!(data[0]["client"], Value::Null);
}

async fn audit_ids_and_cursors_tell_nothing_of_other_organizations(pg: bool) {
    let w = world(pg).await;
    // Another organization is busy in between.
    let other = seed(&w.path, "globex", "gus", "owner", "clusters:read");
    for _ in 0..3 {
        create_key(&w.path, "globex", "gus", "clusters:read");
    }
    create_key(&w.path, "acme", "alice", "clusters:read");
    let (status, page) = call(
        &w,
        reqwest::Method::GET,
        &format!("{AUDIT}&limit=1"),
        &w.seed.session,
        None,
    )
    .await;
    assert_eq!(status, 200, "{page}");
    let id = page["data"][0]["id"].as_str().unwrap().to_string();
    let cursor = page["next_cursor"].as_str().unwrap().to_string();
    // `evt_` and 16 base62 characters: no counter shared by every organization.
    for opaque in [&id, &cursor] {
        let rest = opaque
            .strip_prefix("evt_")
            .unwrap_or_else(|| panic!("{opaque}"));
        assert_eq!(rest.len(), 16, "{opaque}");
        assert!(rest.bytes().all(|b| b.is_ascii_alphanumeric()), "{opaque}");
        assert!(!rest.bytes().all(|b| b.is_ascii_digit()), "{opaque}");
    }
    // The next page follows; the cursor is no good for another organization.
    let (status, next) = call(
        &w,
        reqwest::Method::GET,
        &format!("{AUDIT}&limit=1&cursor={cursor}"),
        &w.seed.session,
        None,
    )
    .await;
    assert_eq!(status, 200, "{next}");
    assert_eq!(next["data"][0]["key_id"], w.seed.key_id.as_str(), "{next}");
    let (status, body) = call(
        &w,
        reqwest::Method::GET,
        &format!("/api/v1/audit-events?organization_id=globex&cursor={cursor}"),
        &other.session,
        None,
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["details"]["field"], "cursor", "{body}");
}

/// The audit trail is refused to what may not read keys: a member whose role
/// lacks `api-keys:read` (403 naming it), a non-member (404), and an API key,
/// which is not a session (401).
#[tokio::test]
async fn the_audit_trail_is_refused_without_api_keys_read_to_strangers_and_to_api_keys() {
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    cfg.set("roles.reader", vec!["clusters:read".to_string()]);
    let path = cfg.write();
    let alice = seed(&path, "acme", "alice", "owner", "clusters:read");
    let rita = seed(&path, "acme", "rita", "reader", "clusters:read");
    let mallory = seed(&path, "evil", "mallory", "owner", "clusters:read");
    let gw = Gateway::start(&path);
    let audit = |token: &str| {
        client()
            .get(gw.url(AUDIT))
            .bearer_auth(token.to_string())
            .send()
    };
    let res = audit(&alice.session).await.unwrap();
    assert_eq!(res.status(), 200, "the owner reads it");
    let res = audit(&rita.session).await.unwrap();
    assert_eq!(res.status(), 403);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["details"]["required_scope"], "api-keys:read", "{body}");
    let res = audit(&mallory.session).await.unwrap();
    assert_eq!(res.status(), 404, "another organization's member");
    let res = audit(&alice.key).await.unwrap();
    assert_eq!(res.status(), 401);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["details"]["reason"], "wrong_credential_type", "{body}");
}

async fn patch_changes_only_the_fields_named_and_audits_their_names(pg: bool) {
    let w = world(pg).await;
    let s = &w.seed.session;
    let one = format!("/api/v1/api-keys/{}", w.seed.key_id);
    let patch = |body: Value| call(&w, reqwest::Method::PATCH, &one, s, Some(body));
    let controls = |k: &Value| {
        json!([
            k["name"],
            k["enabled"],
            k["ip_allow"],
            k["meta"],
            k["rate_limit"],
            k["credits"]
        ])
    };

    let (status, k) = patch(json!({
        "name": "renamed", "enabled": false, "ip_allow": ["203.0.113.0/24", "2001:db8::1"],
        "meta": {"plan": "pro"}, "rate_limit": {"requests": 5, "per": "60s"},
        "credits": {"refill": {"amount": 10, "interval": "24h"}},
    }))
    .await;
    assert_eq!(status, 200, "{k}");
    let changed = json!([
        "renamed", false, ["203.0.113.0/24", "2001:db8::1/128"], {"plan": "pro"},
        {"requests": 5, "per": "1m"}, {"remaining": 10, "refill": {"amount": 10, "interval": "1d"}},
    ]);
    assert_eq!(controls(&k), changed);
    assert_eq!(k["scopes"], json!(["clusters:read"]));
    let (_, got) = call(&w, reqwest::Method::GET, &one, s, None).await;
    assert_eq!(controls(&got), changed, "{got}");

    // A count alone keeps the refill; null clears.
    let (status, k) = patch(json!({"credits": {"remaining": 3}})).await;
    assert_eq!(status, 200, "{k}");
    assert_eq!(
        k["credits"],
        json!({"remaining": 3, "refill": {"amount": 10, "interval": "1d"}})
    );
    let (status, k) = patch(json!({
        "enabled": true, "ip_allow": null, "meta": null, "rate_limit": null, "credits": null,
    }))
    .await;
    assert_eq!(status, 200, "{k}");
    assert_eq!(
        controls(&k),
        json!(["renamed", true, null, null, null, null])
    );

    // Refused by field, and nothing changes.
    for (body, field) in [
        (json!({}), "body"),
        (json!({"scopes": ["clusters:read"]}), "scopes"),
        (json!({"expires_at": null}), "expires_at"),
        (json!({"bogus": 1}), "bogus"),
        (json!({"name": " "}), "name"),
        (json!({"enabled": "no"}), "enabled"),
        (json!({"ip_allow": ["10.0.0.1/8"]}), "ip_allow"),
        (json!({"meta": [1]}), "meta"),
        (json!({"credits": {"remaining": -1}}), "credits.remaining"),
        // Unlimited credits have no count to keep.
        (json!({"credits": {}}), "credits.remaining"),
        (json!({"credits": {"refill": null}}), "credits.remaining"),
        (
            json!({"credits": {"refill": {"amount": -1, "interval": "1d"}}}),
            "credits.refill.amount",
        ),
        (
            json!({"credits": {"refill": {"amount": 1, "interval": "30s"}}}),
            "credits.refill.interval",
        ),
    ] {
        let (status, res) = patch(body.clone()).await;
        assert_eq!(status, 400, "{body}: {res}");
        assert_eq!(res["details"]["field"], field, "{body}: {res}");
    }
    let (_, got) = call(&w, reqwest::Method::GET, &one, s, None).await;
    assert_eq!(
        controls(&got),
        json!(["renamed", true, null, null, null, null])
    );

    // One event per change, naming the fields set.
    let audit = "/api/v1/audit-events?organization_id=acme";
    let (_, trail) = call(&w, reqwest::Method::GET, audit, s, None).await;
    let updates: Vec<&Value> = trail["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "api_key.updated")
        .collect();
    assert_eq!(updates.len(), 3, "{trail}");
    assert_eq!(
        updates[0]["fields"],
        json!(["enabled", "ip_allow", "meta", "rate_limit", "credits"])
    );
    assert_eq!(updates[1]["fields"], json!(["credits"]));
    assert_eq!(
        updates[2]["fields"],
        json!([
            "name",
            "enabled",
            "ip_allow",
            "meta",
            "rate_limit",
            "credits"
        ])
    );
    assert_eq!(updates[0]["actor"], "alice");
    assert_eq!(updates[0]["key_id"], w.seed.key_id.as_str());

    // A revoked key cannot change.
    let revoke = format!("{one}/revoke");
    let (status, _) = call(&w, reqwest::Method::POST, &revoke, s, None).await;
    assert_eq!(status, 200);
    let (status, res) = patch(json!({"name": "again"})).await;
    assert_eq!(status, 400, "{res}");
    assert_eq!(res["details"]["field"], "id", "{res}");
}
