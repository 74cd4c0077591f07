//! `mpg-gateway demo`: the one-command quick start. A temporary SQLite store,
//! a self-signed certificate, an in-process demo clusters service, seeded
//! data, and `curl` lines that work when pasted. Ctrl-C stops it.
use crate::http::body::RequestBody;
use http::{Request, Response, StatusCode};
use serde_json::json;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

use crate::cli::Failure;
use crate::config::Settings;
use crate::http::body::{self, Body};
use crate::http::service::{ConnInfo, Handler, Reply};
use crate::server::{serve, ListenerLimits};
use crate::store::NewApiKey;

/// The shipped route table, which the demo serves unchanged.
const SHIPPED_CONFIG: &str = include_str!("../config/gateway.toml");

/// A stand-in for the clusters backend: lists two clusters of the
/// organization the gateway vouches for in `X-Mpg-Organization-Id`.
pub struct DemoClusters;

impl Handler for DemoClusters {
    async fn handle(&self, req: Request<RequestBody>, _conn: Arc<ConnInfo>) -> Reply {
        self.answer(req).await.into()
    }
}

impl DemoClusters {
    async fn answer(&self, req: Request<RequestBody>) -> Response<Body> {
        let org = req
            .headers()
            .get("x-mpg-organization-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let body = json!({
            "data": [
                { "id": "cl_demo_primary", "organization_id": org, "name": "primary", "engine": "postgres-16", "status": "running" },
                { "id": "cl_demo_analytics", "organization_id": org, "name": "analytics", "engine": "postgres-16", "status": "running" }
            ]
        });
        let mut res = Response::new(body::full(body.to_string()));
        if req.uri().path() != "/api/v1/clusters" {
            *res.status_mut() = StatusCode::NOT_FOUND;
        }
        res.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        res
    }
}

/// The demo configuration: the shipped routes, with the listener, the
/// certificate, the store and the clusters target replaced.
pub fn demo_settings(
    listen: SocketAddr,
    db_path: &str,
    clusters: SocketAddr,
) -> Result<Settings, Failure> {
    let mut table: toml::Table = SHIPPED_CONFIG
        .parse()
        .map_err(|e| Failure::runtime(format!("shipped config: {e}")))?;
    let set = |table: &mut toml::Table, path: &[&str], value: toml::Value| {
        let mut t = table;
        for key in &path[..path.len() - 1] {
            t = t
                .entry(key.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                .as_table_mut()
                .expect("config sections are tables");
        }
        t.insert(path[path.len() - 1].to_string(), value);
    };
    set(
        &mut table,
        &["server", "listen"],
        toml::Value::String(listen.to_string()),
    );
    let mut tls = toml::Table::new();
    tls.insert("self_signed".into(), toml::Value::Boolean(true));
    set(&mut table, &["server", "tls"], toml::Value::Table(tls));
    set(
        &mut table,
        &["store", "path"],
        toml::Value::String(db_path.to_string()),
    );
    set(
        &mut table,
        &["upstreams", "clusters", "targets"],
        toml::Value::Array(vec![toml::Value::String(format!("http://{clusters}"))]),
    );
    set(
        &mut table,
        &["admin", "enabled"],
        toml::Value::Boolean(false),
    );
    let text = toml::to_string(&table).map_err(|e| Failure::runtime(e.to_string()))?;
    Settings::parse(&text).map_err(|problems| {
        let lines: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
        Failure::runtime(format!("demo config: {}", lines.join("; ")))
    })
}

/// Runs the demo until Ctrl-C (or SIGTERM).
pub async fn run(listen: SocketAddr) -> Result<(), Failure> {
    let mut signals = crate::signals::Signals::register();
    let dir = tempfile::tempdir()
        .map_err(|e| Failure::runtime(format!("cannot create a temp dir: {e}")))?;
    let db = dir.path().join("gateway.db");
    let clusters_listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| Failure::runtime(format!("demo clusters service: {e}")))?;
    let clusters_addr = clusters_listener
        .local_addr()
        .map_err(|e| Failure::runtime(e.to_string()))?;
    let limits = ListenerLimits {
        name: "demo-clusters",
        idle_timeout: Duration::from_secs(60),
        max_connections: 1024,
        header_read_timeout: Duration::from_secs(10),
        max_header_bytes: 16 * 1024,
        shutdown_grace: Duration::from_secs(1),
    };
    let (stop_clusters, stopped) = tokio::sync::oneshot::channel::<()>();
    let clusters = tokio::spawn(serve(
        clusters_listener,
        None,
        limits,
        Arc::new(DemoClusters),
        async {
            let _ = stopped.await;
        },
    ));

    let settings = demo_settings(listen, &db.to_string_lossy(), clusters_addr)?;
    let store = crate::app::open_store(&settings)
        .await
        .map_err(|e| Failure::runtime(e.to_string()))?;
    let seeded = seed(&store).await?;
    let running = crate::app::start(settings, None)
        .await
        .map_err(|e| Failure::runtime(e.to_string()))?;
    print_welcome(running.addr, &seeded);

    // Ctrl-C or SIGTERM: either way the temporary store is removed.
    signals.stop().await;
    eprintln!("\nstopping…");
    running.stop().await;
    let _ = stop_clusters.send(());
    let _ = clusters.await;
    Ok(())
}

struct Seeded {
    session: String,
    key: String,
    key_id: String,
}

async fn seed(store: &crate::store::sql::SqlStore) -> Result<Seeded, Failure> {
    store.create_organization("acme", Some("Acme Inc.")).await?;
    store
        .create_user("alice", Some("alice@example.com"))
        .await?;
    store.set_member("acme", "alice", "owner").await?;
    let (session, _) = store
        .create_session("alice", Duration::from_secs(12 * 3600))
        .await?;
    let new = NewApiKey {
        organization_id: "acme".into(),
        user_id: "alice".into(),
        name: "demo key".into(),
        scopes: vec!["clusters:read".into()],
        expires_at: None,
    };
    let (key, record) = store.create_api_key(new).await?;
    Ok(Seeded {
        session,
        key,
        key_id: record.id,
    })
}

fn print_welcome(addr: SocketAddr, s: &Seeded) {
    let base = format!("https://{addr}/api/v1");
    println!(
        "mpg-gateway demo is running on {addr} (self-signed TLS; embedded SQLite in a temp dir).
Seeded: organization acme, user alice (owner), a session token and an API key (scope clusters:read).

# List clusters with the API key:
curl -k -H 'Authorization: Bearer {key}' '{base}/clusters?organization_id=acme'

# The same key for another organization is a 404; no key is a 401:
curl -k -H 'Authorization: Bearer {key}' '{base}/clusters?organization_id=other'
curl -k '{base}/clusters?organization_id=acme'

# Manage keys with the session token:
curl -k -H 'Authorization: Bearer {session}' '{base}/api-keys?organization_id=acme'
curl -k -X POST -H 'Authorization: Bearer {session}' -H 'Content-Type: application/json' \\
     -d '{{\"name\":\"ci\",\"scopes\":[\"clusters:read\"]}}' '{base}/api-keys?organization_id=acme'
curl -k -X POST -H 'Authorization: Bearer {session}' '{base}/api-keys/{key_id}/revoke'

# After the revoke, the key gets 401 with reason \"revoked\":
curl -k -H 'Authorization: Bearer {key}' '{base}/clusters?organization_id=acme'

Press Ctrl-C to stop.",
        key = s.key,
        session = s.session,
        key_id = s.key_id,
    );
}
