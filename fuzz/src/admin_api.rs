//! The admin API's request bodies and paths, served end to end by the admin
//! handler over an SQLite store: any body, path and method gives a JSON
//! answer, never a panic nor a 5xx; a refusal is the error body of the API
//! (`error` and `message`); and no answer holds the admin token, nor (when it
//! refuses) any other secret.
use bytes::Bytes;
use http::{Method, Request};
use mpg_gateway::config::Settings;
use mpg_gateway::secret::looks_like_secret;
use mpg_gateway::store::sql::SqlStore;
use mpg_gateway::store::StoreConfig;
use std::sync::LazyLock;
use std::time::Duration;
use tokio::runtime::Runtime;

/// A store with one organization (`acme`), one member (`alice`) and an
/// admin token, the shipped settings, and a runtime to serve them on.
struct World {
    rt: Runtime,
    store: SqlStore,
    settings: Settings,
    token: String,
    policy: String,
}

static WORLD: LazyLock<World> = LazyLock::new(|| {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = std::env::temp_dir().join(format!("mpg-fuzz-admin-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cfg = StoreConfig {
        url: format!("sqlite://{}/gateway.db", dir.display()),
        query_timeout: Duration::from_secs(5),
    };
    let (store, token) = rt.block_on(async {
        let store = SqlStore::connect(&cfg).await.expect("sqlite store");
        store.migrate().await.expect("migrate");
        store.create_organization("acme", None).await.unwrap();
        store.create_user("alice", None).await.unwrap();
        store.set_member("acme", "alice", "admin").await.unwrap();
        let (token, _) = store.create_admin_token("fuzz").await.unwrap();
        (store, token)
    });
    let settings = crate::shipped_settings();
    let policy = settings.rate_limit.policies[0].name.clone();
    World {
        rt,
        store,
        settings,
        token,
        policy,
    }
});

/// One input: the first byte picks the request (an endpoint that takes a
/// body, or a method with the path on the input's first line); the rest is
/// the body.
pub fn run(data: &[u8]) {
    let w = &*WORLD;
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let (method, path, body) = match selector % 6 {
        0 => (Method::POST, "organizations".to_owned(), rest),
        1 => (Method::POST, "users".to_owned(), rest),
        2 => (Method::PUT, "organizations/acme/members/alice".to_owned(), rest),
        3 => (Method::POST, "sessions".to_owned(), rest),
        4 => (Method::PUT, format!("organizations/acme/limits/{}", w.policy), rest),
        _ => {
            let (path, body) = match rest.iter().position(|&b| b == b'\n') {
                Some(i) => (&rest[..i], &rest[i + 1..]),
                None => (rest, &b""[..]),
            };
            let method = [Method::GET, Method::POST, Method::PUT, Method::DELETE]
                [usize::from(selector >> 6)]
            .clone();
            (method, String::from_utf8_lossy(path).into_owned(), body)
        }
    };
    let Ok(req) = Request::builder()
        .method(method)
        .uri(format!("/admin/v1/{path}"))
        .header("authorization", format!("Bearer {}", w.token))
        .header("content-type", "application/json")
        .body(Bytes::copy_from_slice(body))
    else {
        return;
    };
    let (status, answer) = w.rt.block_on(mpg_gateway::wire::admin_api(
        &w.store,
        &w.settings,
        req,
    ));
    assert!(!status.is_server_error(), "{status}: {answer:?}");
    if status.as_u16() == 204 {
        return;
    }
    let json: serde_json::Value = serde_json::from_slice(&answer).expect("a JSON answer");
    let text = String::from_utf8_lossy(&answer);
    assert!(!text.contains(&w.token), "the admin token in an answer");
    if status.is_client_error() {
        assert!(json["error"].is_string() && json["message"].is_string(), "{json}");
        assert!(!looks_like_secret(answer.iter().copied()), "{text}");
    }
}
