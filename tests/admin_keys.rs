//! The admin API's keys over HTTP, on both stores: a key created for a
//! member works through the gateway; it is changed, disabled, rotated,
//! revoked and deleted through `/admin/v1/keys/{id}`, each change refused by
//! the gateway within a second; every step is in the organization's audit
//! trail with the admin token as its actor; bad input is a 400 naming the
//! field, and nothing changes.
mod common;

use common::admin::{acme_with_alice, admin_api, call, status_of, AdminWorld};
use common::*;
use reqwest::Method;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const CLUSTERS: &str = "/api/v1/clusters?organization_id=acme";

on_both_stores!(
    a_key_is_created_changed_rotated_revoked_and_deleted,
    bad_key_input_is_a_400_naming_the_field_and_changes_nothing,
);

/// Waits up to a second for the gateway to answer `key` with `want`.
async fn within_a_second(w: &AdminWorld, key: &str, want: u16) {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let (got, reason) = use_key(&w.gw, key).await;
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "still {got} ({reason}), not {want}, after 1 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn a_key_is_created_changed_rotated_revoked_and_deleted(pg: bool) {
    let w = admin_api(pg).await;
    let t = Some(w.token.as_str());
    acme_with_alice(&w).await;
    let (status, created) = call(
        &w,
        Method::POST,
        "/admin/v1/organizations/acme/keys",
        t,
        Some(json!({
            "user_id": "alice",
            "name": "ci",
            "scopes": ["clusters:read"],
            "meta": {"plan": "trial"},
            "credits": {"remaining": 3, "refill": null},
        })),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let (id, secret) = (
        created["id"].as_str().unwrap().to_owned(),
        created["key"].as_str().unwrap().to_owned(),
    );
    assert!(secret.starts_with("mpg_"), "{created}");
    assert_eq!(created["user_id"], "alice");
    assert_eq!(created["organization_id"], "acme");
    assert_eq!(created["credits"]["remaining"], 3);
    // It works through the gateway, spending its credits.
    let res = client()
        .get(w.gw.url(CLUSTERS))
        .bearer_auth(&secret)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["x-credits-remaining"], "2");
    // Listed and read, never with its secret.
    let (status, listed) = call(
        &w,
        Method::GET,
        "/admin/v1/organizations/acme/keys",
        t,
        None,
    )
    .await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["data"][0]["id"], id.as_str(), "{listed}");
    let (status, read) = call(&w, Method::GET, &format!("/admin/v1/keys/{id}"), t, None).await;
    assert_eq!(status, 200, "{read}");
    assert_eq!(read["meta"], json!({"plan": "trial"}));
    for body in [&listed, &read] {
        assert!(!body.to_string().contains(&secret), "{body}");
    }

    // Disabled: refused within a second; enabled again with more credits.
    let key_path = format!("/admin/v1/keys/{id}");
    let (status, changed) = call(
        &w,
        Method::PATCH,
        &key_path,
        t,
        Some(json!({"enabled": false})),
    )
    .await;
    assert_eq!(
        (status, &changed["enabled"]),
        (200, &json!(false)),
        "{changed}"
    );
    within_a_second(&w, &secret, 401).await;
    assert_eq!(use_key(&w.gw, &secret).await.1, "disabled");
    let more = json!({"enabled": true, "credits": {"remaining": 10}});
    let (status, changed) = call(&w, Method::PATCH, &key_path, t, Some(more)).await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!(changed["credits"]["remaining"], 10);
    within_a_second(&w, &secret, 200).await;

    // Rotated: the new secret works, the old one is refused.
    let (status, rotated) = call(
        &w,
        Method::POST,
        &format!("{key_path}/rotate"),
        t,
        Some(json!({"grace_period_seconds": 0})),
    )
    .await;
    assert_eq!(status, 201, "{rotated}");
    let new_id = rotated["id"].as_str().unwrap().to_owned();
    let new_secret = rotated["key"].as_str().unwrap().to_owned();
    assert_ne!(new_id, id);
    within_a_second(&w, &secret, 401).await;
    within_a_second(&w, &new_secret, 200).await;

    // Revoked: refused within a second, and it cannot change any more.
    let new_path = format!("/admin/v1/keys/{new_id}");
    let (status, revoked) = call(&w, Method::POST, &format!("{new_path}/revoke"), t, None).await;
    assert_eq!(
        (status, &revoked["status"]),
        (200, &json!("revoked")),
        "{revoked}"
    );
    within_a_second(&w, &new_secret, 401).await;
    let (status, refused) = call(&w, Method::PATCH, &new_path, t, Some(json!({"name": "x"}))).await;
    assert_eq!(status, 400, "{refused}");
    assert_eq!(refused["details"]["field"], "id");

    // Deleted: gone.
    assert_eq!(status_of(&w, Method::DELETE, &key_path, None).await, 204);
    assert_eq!(status_of(&w, Method::GET, &key_path, None).await, 404);
    assert_eq!(status_of(&w, Method::DELETE, &key_path, None).await, 404);

    // The trail, newest first, with the admin token as the actor.
    let (status, trail) = call(
        &w,
        Method::GET,
        "/admin/v1/organizations/acme/audit-events?limit=100",
        t,
        None,
    )
    .await;
    assert_eq!(status, 200, "{trail}");
    let token_id = cli_ok(&w.path, &["admin-tokens", "list"])["data"][0]["id"].clone();
    let keys: Vec<(&str, &str)> = trail["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"].as_str().unwrap().starts_with("api_key."))
        .map(|e| {
            assert_eq!(e["actor"], token_id, "{e}");
            (e["action"].as_str().unwrap(), e["key_id"].as_str().unwrap())
        })
        .collect();
    let (old, new) = (id.as_str(), new_id.as_str());
    assert_eq!(
        keys,
        [
            ("api_key.deleted", old),
            ("api_key.revoked", new),
            ("api_key.rotated", old),
            ("api_key.created", new),
            ("api_key.updated", old),
            ("api_key.updated", old),
            ("api_key.created", old),
        ],
        "{trail}"
    );
    assert!(
        !trail.to_string().contains("trial"),
        "meta's values in the trail"
    );
    let log = w.gw.log_text();
    for s in [&secret, &new_secret] {
        assert!(!log.contains(s.as_str()), "a key's secret reached the log");
    }
}

async fn bad_key_input_is_a_400_naming_the_field_and_changes_nothing(pg: bool) {
    let w = admin_api(pg).await;
    let t = Some(w.token.as_str());
    acme_with_alice(&w).await;
    let made = call(
        &w,
        Method::POST,
        "/admin/v1/users",
        t,
        Some(json!({"id": "bob"})),
    )
    .await;
    assert_eq!(made.0, 201);
    let keys = "/admin/v1/organizations/acme/keys";
    let good = json!({"user_id": "alice", "name": "ci", "scopes": ["clusters:read"]});
    let with = |field: &str, value: Value| {
        let mut body = good.clone();
        body[field] = value;
        body
    };
    let without = |field: &str| {
        let mut body = good.clone();
        body.as_object_mut().unwrap().remove(field);
        body
    };
    for (body, field) in [
        (with("user_id", json!("bob")), "user_id"),
        (without("user_id"), "user_id"),
        (with("user_id", json!(7)), "user_id"),
        (without("scopes"), "scopes"),
        (with("scopes", json!(["clusters:everything"])), "scopes"),
        (with("name", json!(" ")), "name"),
        (with("organization_id", json!("other")), "organization_id"),
        (with("ip_allow", json!(["10.0.0.1/8"])), "ip_allow"),
        (
            with("credits", json!({"remaining": -1})),
            "credits.remaining",
        ),
        (json!([1]), "body"),
    ] {
        let (status, refused) = call(&w, Method::POST, keys, t, Some(body.clone())).await;
        assert_eq!(status, 400, "{body}: {refused}");
        assert_eq!(refused["details"]["field"], field, "{body}: {refused}");
    }
    let (_, listed) = call(&w, Method::GET, keys, t, None).await;
    assert_eq!(listed["data"], json!([]), "{listed}");

    let (status, created) = call(&w, Method::POST, keys, t, Some(good.clone())).await;
    assert_eq!(status, 201, "{created}");
    let key_path = format!("/admin/v1/keys/{}", created["id"].as_str().unwrap());
    for (body, field) in [
        (json!({"scopes": ["clusters:write"]}), "scopes"),
        (json!({"key": "mpg_x"}), "key"),
        (json!({"meta": [1]}), "meta"),
        (json!({}), "body"),
    ] {
        let (status, refused) = call(&w, Method::PATCH, &key_path, t, Some(body.clone())).await;
        assert_eq!(status, 400, "{body}: {refused}");
        assert_eq!(refused["details"]["field"], field, "{body}: {refused}");
    }
    let bad_grace = Some(json!({"grace_period_seconds": -1}));
    let (status, refused) = call(
        &w,
        Method::POST,
        &format!("{key_path}/rotate"),
        t,
        bad_grace,
    )
    .await;
    assert_eq!(status, 400, "{refused}");
    let (_, read) = call(&w, Method::GET, &key_path, t, None).await;
    let mut unchanged = created.clone();
    unchanged.as_object_mut().unwrap().remove("key");
    assert_eq!(read, unchanged);

    // Unknown ids, unknown paths, other methods.
    assert_eq!(
        status_of(&w, Method::GET, "/admin/v1/keys/key_nope", None).await,
        404
    );
    assert_eq!(
        status_of(&w, Method::POST, "/admin/v1/keys/key_nope/revoke", None).await,
        404
    );
    assert_eq!(
        status_of(&w, Method::POST, &format!("{key_path}/frobnicate"), None).await,
        404
    );
    for (method, path, allow) in [
        (Method::PUT, key_path.clone(), "GET, PATCH, DELETE"),
        (Method::GET, format!("{key_path}/revoke"), "POST"),
        (Method::DELETE, keys.to_owned(), "GET, POST"),
        (
            Method::POST,
            "/admin/v1/organizations/acme/audit-events".to_owned(),
            "GET",
        ),
    ] {
        let res = client()
            .request(method.clone(), format!("http://{}{path}", w.admin))
            .bearer_auth(&w.token)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 405, "{method} {path}");
        assert_eq!(res.headers()["allow"], allow, "{method} {path}");
    }
    // Without a token, nothing.
    let (status, _) = call(&w, Method::GET, &key_path, None, None).await;
    assert_eq!(status, 401);
}
