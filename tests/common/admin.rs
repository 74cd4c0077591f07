//! The admin API's test world: a gateway with its admin listener, an admin
//! token from `mpg-gateway admin-tokens`, and calls with that token.
use super::scale::PgDb;
use super::*;
use serde_json::{json, Value};

/// A gateway with the admin API on, on SQLite or its own PostgreSQL database.
pub struct AdminWorld {
    pub up: MockUpstream,
    pub _cfg: TestConfig,
    pub path: std::path::PathBuf,
    pub gw: Gateway,
    pub admin: std::net::SocketAddr,
    pub token: String,
    /// Dropped last, after the gateway.
    pub db: Option<PgDb>,
}

pub async fn admin_api(pg: bool) -> AdminWorld {
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    let db = if pg { Some(PgDb::create().await) } else { None };
    if let Some(db) = &db {
        cfg.postgres(&db.url);
    }
    cfg.set("admin.enabled", true);
    cfg.set("admin.listen", "127.0.0.1:0");
    let path = cfg.write();
    let made = cli_ok(&path, &["admin-tokens", "create", "--name", "provisioner"]);
    let token = made["token"].as_str().unwrap().to_string();
    let gw = Gateway::start(&path);
    let admin = gw.admin.expect("admin listener address logged");
    AdminWorld {
        up,
        _cfg: cfg,
        path,
        gw,
        admin,
        token,
        db,
    }
}

/// `method path` on the admin API with `token` and `body`: (status, JSON).
pub async fn call(
    w: &AdminWorld,
    method: reqwest::Method,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = client().request(method, format!("http://{}{path}", w.admin));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    exchange(req, body).await
}

/// Organization `acme` with user `alice` as its owner, made through the API.
pub async fn acme_with_alice(w: &AdminWorld) {
    use reqwest::Method;
    let org = Some(json!({"id": "acme"}));
    assert_eq!(
        status_of(w, Method::POST, "/admin/v1/organizations", org).await,
        201
    );
    let user = Some(json!({"id": "alice"}));
    assert_eq!(
        status_of(w, Method::POST, "/admin/v1/users", user).await,
        201
    );
    let member = "/admin/v1/organizations/acme/members/alice";
    let role = Some(json!({"role": "owner"}));
    assert_eq!(status_of(w, Method::PUT, member, role).await, 200);
}

/// The status of `method path` on the admin API with the world's token.
pub async fn status_of(
    w: &AdminWorld,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> u16 {
    call(w, method, path, Some(&w.token), body).await.0
}
