//! The admin commands a team runs day to day: listing organizations, users,
//! members and sessions, removing a member, revoking a session, deleting an
//! organization or a user. Each is checked on SQLite and PostgreSQL, for its
//! JSON and exit codes, and against running gateways: what a command removes
//! is refused there within a second, although `cache_ttl` is an hour.
mod common;

use common::scale::{within, PgDb};
use common::*;
use serde_json::Value;
use std::time::Duration;

/// A config on SQLite or on a PostgreSQL database of its own.
async fn config_on(pg: bool, upstream: std::net::SocketAddr) -> (TestConfig, Option<PgDb>) {
    let mut cfg = TestConfig::new(upstream);
    if !pg {
        return (cfg, None);
    }
    let db = PgDb::create().await;
    cfg.postgres(&db.url);
    (cfg, Some(db))
}

fn ids(list: &Value, field: &str) -> Vec<String> {
    list["data"]
        .as_array()
        .unwrap_or_else(|| panic!("no data in {list}"))
        .iter()
        .map(|v| v[field].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_and_removing_print_json_and_refuse_unknown_ids_on_sqlite() {
    listing_and_removing(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_and_removing_print_json_and_refuse_unknown_ids_on_postgres() {
    listing_and_removing(true).await;
}

async fn listing_and_removing(pg: bool) {
    let (cfg, _db) = config_on(pg, "127.0.0.1:9".parse().unwrap()).await;
    let path = cfg.write();
    assert_eq!(
        admin_ok(&path, &["orgs", "list"]).await["data"],
        Value::Array(vec![])
    );
    admin_ok(
        &path,
        &["orgs", "create", "--id", "globex", "--name", "Globex"],
    )
    .await;
    admin_ok(&path, &["orgs", "create", "--id", "acme"]).await;
    admin_ok(&path, &["users", "create", "--id", "bob"]).await;
    admin_ok(
        &path,
        &[
            "users",
            "create",
            "--id",
            "alice",
            "--email",
            "a@example.com",
        ],
    )
    .await;
    let orgs = admin_ok(&path, &["orgs", "list"]).await;
    assert_eq!(ids(&orgs, "id"), ["acme", "globex"]);
    assert_eq!(orgs["data"][1]["name"], "Globex");
    let users = admin_ok(&path, &["users", "list"]).await;
    assert_eq!(ids(&users, "id"), ["alice", "bob"]);
    assert_eq!(users["data"][0]["email"], "a@example.com");
    assert!(users["data"][0]["created_at"]
        .as_str()
        .unwrap()
        .ends_with('Z'));

    for (org, user, role) in [
        ("acme", "alice", "owner"),
        ("acme", "bob", "viewer"),
        ("globex", "alice", "member"),
    ] {
        admin_ok(
            &path,
            &[
                "members", "add", "--org", org, "--user", user, "--role", role,
            ],
        )
        .await;
    }
    let members = admin_ok(&path, &["members", "list", "--org", "acme"]).await;
    assert_eq!(ids(&members, "user_id"), ["alice", "bob"]);
    assert_eq!(members["data"][1]["role"], "viewer");
    assert_eq!(members["data"][1]["organization_id"], "acme");
    refused(
        &path,
        &["members", "list", "--org", "nope"],
        "organization nope not found",
    )
    .await;

    // Sessions: listed with ids and times, never the token or its hash.
    let token = admin_ok(&path, &["sessions", "create", "--user", "alice"]).await["token"]
        .as_str()
        .unwrap()
        .to_owned();
    admin_ok(
        &path,
        &["sessions", "create", "--user", "alice", "--ttl", "1s"],
    )
    .await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let (code, listed, err) = admin(&path, &["sessions", "list", "--user", "alice"]).await;
    assert_eq!(code, 0, "{err}");
    let sessions = listed["data"].as_array().unwrap();
    assert_eq!(sessions.len(), 2);
    for s in sessions {
        let mut fields: Vec<&str> = s.as_object().unwrap().keys().map(String::as_str).collect();
        fields.sort_unstable();
        assert_eq!(
            fields,
            ["created_at", "expires_at", "id", "status", "user_id"]
        );
    }
    let mut statuses: Vec<&str> = sessions
        .iter()
        .map(|s| s["status"].as_str().unwrap())
        .collect();
    statuses.sort_unstable();
    assert_eq!(statuses, ["active", "expired"]);
    let text = listed.to_string();
    let hash = mpg_gateway::secret::hash_secret(&token).to_hex();
    assert!(!text.contains(&token) && !text.contains(&hash), "{text}");
    refused(
        &path,
        &["sessions", "list", "--user", "carol"],
        "user carol not found",
    )
    .await;
    let first = sessions[0]["id"].as_str().unwrap().to_owned();
    let revoked = admin_ok(&path, &["sessions", "revoke", &first]).await;
    assert_eq!(revoked["id"], first.as_str());
    assert_eq!(revoked["status"], "revoked");
    assert!(revoked.get("token").is_none());
    refused(&path, &["sessions", "revoke", &first], "no session with id").await;
    assert_eq!(
        admin_ok(&path, &["sessions", "list", "--user", "alice"]).await["data"]
            .as_array()
            .unwrap()
            .len(),
        1
    );

    // Members: removed once; then "not a member".
    let removed = admin_ok(
        &path,
        &["members", "remove", "--org", "acme", "--user", "bob"],
    )
    .await;
    assert_eq!(removed["role"], "viewer");
    assert_eq!(removed["removed"], true);
    refused(
        &path,
        &["members", "remove", "--org", "acme", "--user", "bob"],
        "user \"bob\" is not a member of organization \"acme\"",
    )
    .await;
    refused(
        &path,
        &["members", "remove", "--org", "nope", "--user", "bob"],
        "organization nope not found",
    )
    .await;
    refused(
        &path,
        &["members", "remove", "--org", "acme", "--user", "carol"],
        "user carol not found",
    )
    .await;

    // Deleting an organization: its keys and memberships, not its users.
    let (_, acme_key) = create_key(&path, "acme", "alice", "clusters:read");
    let (_, globex_key) = create_key(&path, "globex", "alice", "clusters:read");
    let deleted = admin_ok(&path, &["orgs", "delete", "acme"]).await;
    assert_eq!(deleted["deleted"], "acme");
    assert_eq!(deleted["api_keys_deleted"], serde_json::json!([acme_key]));
    assert_eq!(deleted["memberships_removed"], serde_json::json!(["alice"]));
    refused(
        &path,
        &["orgs", "delete", "acme"],
        "no organization with id \"acme\"",
    )
    .await;
    refused(&path, &["keys", "get", &acme_key], "no API key").await;
    assert_eq!(
        ids(&admin_ok(&path, &["users", "list"]).await, "id"),
        ["alice", "bob"]
    );
    assert_eq!(
        ids(&admin_ok(&path, &["orgs", "list"]).await, "id"),
        ["globex"]
    );

    // Deleting a user: sessions, keys everywhere, memberships.
    let deleted = admin_ok(&path, &["users", "delete", "alice"]).await;
    assert_eq!(deleted["deleted"], "alice");
    assert_eq!(deleted["sessions_ended"].as_array().unwrap().len(), 1);
    assert_eq!(deleted["api_keys_deleted"], serde_json::json!([globex_key]));
    assert_eq!(
        deleted["memberships_removed"],
        serde_json::json!(["globex"])
    );
    refused(
        &path,
        &["users", "delete", "alice"],
        "no user with id \"alice\"",
    )
    .await;
    assert_eq!(
        ids(&admin_ok(&path, &["users", "list"]).await, "id"),
        ["bob"]
    );
    assert_eq!(
        admin_ok(&path, &["members", "list", "--org", "globex"]).await["data"],
        Value::Array(vec![])
    );
}

const CLUSTERS: &str = "/api/v1/clusters?organization_id=acme";
const KEYS: &str = "/api/v1/api-keys?organization_id=acme";

/// The status `gw` answers for `GET target` with `token`.
async fn status(gw: &Gateway, target: &str, token: &str) -> u16 {
    client()
        .get(gw.url(target))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// Waits until every gateway answers `want`; fails unless within a second
/// (with a margin for a loaded machine), far inside `cache_ttl`.
async fn refused_everywhere(gws: &[Gateway], target: &str, token: &str, want: u16, what: &str) {
    for gw in gws {
        let took = within(Duration::from_secs(5), || async {
            status(gw, target, token).await == want
        })
        .await;
        assert!(
            took.is_some_and(|t| t < Duration::from_millis(1500)),
            "{what}: {want} after {took:?} on {}",
            gw.addr
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_gateways_refuse_what_the_commands_removed_on_sqlite() {
    running_gateways_refuse(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_gateways_refuse_what_the_commands_removed_on_postgres() {
    running_gateways_refuse(true).await;
}

async fn running_gateways_refuse(pg: bool) {
    let up = MockUpstream::start().await;
    let (mut cfg, _db) = config_on(pg, up.addr).await;
    // Only the change log can explain a refusal within a second.
    cfg.set("store.cache_ttl", "1h");
    let path = cfg.write();
    let alice = seed(&path, "acme", "alice", "owner", "clusters:read");
    let bob = seed(&path, "acme", "bob", "member", "clusters:read");
    let carol = seed(&path, "acme", "carol", "member", "clusters:read");
    let globex = seed(&path, "globex", "dave", "owner", "clusters:read");
    // On PostgreSQL, two instances: every one of them must see each change.
    let gws: Vec<Gateway> = (0..if pg { 2 } else { 1 })
        .map(|_| Gateway::start(&path))
        .collect();
    // The change follower clears the cache when it starts; then every credential is cached.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for gw in &gws {
        for _ in 0..2 {
            for s in [&alice, &bob, &carol] {
                assert_eq!(status(gw, KEYS, &s.session).await, 200);
                assert_eq!(status(gw, CLUSTERS, &s.key).await, 200);
            }
            let globex_clusters = "/api/v1/clusters?organization_id=globex";
            assert_eq!(status(gw, globex_clusters, &globex.key).await, 200);
        }
    }

    // sessions revoke: the token is refused (401), the user's key still works.
    let sessions = admin_ok(&path, &["sessions", "list", "--user", "alice"]).await;
    let id = sessions["data"][0]["id"].as_str().unwrap().to_owned();
    admin_ok(&path, &["sessions", "revoke", &id]).await;
    refused_everywhere(&gws, KEYS, &alice.session, 401, "sessions revoke").await;
    assert_eq!(status(&gws[0], CLUSTERS, &alice.key).await, 200);

    // members remove: bob's session no longer sees acme (404) and his key
    // grants nothing there (403).
    admin_ok(
        &path,
        &["members", "remove", "--org", "acme", "--user", "bob"],
    )
    .await;
    refused_everywhere(&gws, KEYS, &bob.session, 404, "members remove (session)").await;
    refused_everywhere(&gws, CLUSTERS, &bob.key, 403, "members remove (key)").await;

    // users delete: carol's session and key are gone (401).
    admin_ok(&path, &["users", "delete", "carol"]).await;
    refused_everywhere(&gws, KEYS, &carol.session, 401, "users delete (session)").await;
    refused_everywhere(&gws, CLUSTERS, &carol.key, 401, "users delete (key)").await;

    // orgs delete: acme's keys are gone (401); its users' sessions live on
    // (alice's new one sees no acme: 404) and other organizations are untouched.
    let fresh = admin_ok(&path, &["sessions", "create", "--user", "alice"]).await;
    let fresh = fresh["token"].as_str().unwrap().to_owned();
    admin_ok(&path, &["orgs", "delete", "acme"]).await;
    refused_everywhere(&gws, CLUSTERS, &alice.key, 401, "orgs delete (key)").await;
    for gw in &gws {
        assert_eq!(status(gw, KEYS, &fresh).await, 404);
        assert_eq!(
            status(gw, "/api/v1/clusters?organization_id=globex", &globex.key).await,
            200
        );
        assert_eq!(
            status(
                gw,
                "/api/v1/api-keys?organization_id=globex",
                &globex.session
            )
            .await,
            200
        );
    }
}
