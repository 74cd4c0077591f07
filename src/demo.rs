//! `mpg-gateway demo`: the one-command quick start. A temporary SQLite store,
//! a self-signed certificate, an in-process demo clusters service, seeded
//! data, and `curl` lines that work when pasted. Ctrl-C stops it.
//!
//! The routes, roles and policies are the shipped `config/gateway.toml`'s, or
//! those of the file named by `--config`; either way the demo replaces the
//! listener, the certificate, the store, the clusters upstream and the admin
//! listener with its own.
use std::borrow::Cow;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

use crate::cli::{DemoArgs, Failure};
use crate::config::{ConfigError, Problem, QuotaSettings, Settings};
use crate::server::{serve, ListenerLimits};
use crate::store::NewApiKey;

mod clusters;
mod welcome;

pub use clusters::DemoClusters;
use welcome::{Seeded, Serving};

/// The shipped route table, which the demo serves unless told otherwise.
const SHIPPED_CONFIG: &str = include_str!("../config/gateway.toml");
/// The organization the demo seeds; its clusters are the service's.
const ORG: &str = "acme";

/// The demo configuration: `base` (a configuration file's text) with the
/// listener, the certificate, the store, the clusters target and the admin
/// listener replaced. `Err` holds every problem, with its TOML path.
pub fn demo_settings(
    base: &str,
    listen: SocketAddr,
    db_path: &str,
    clusters: SocketAddr,
) -> Result<Settings, Vec<Problem>> {
    let problem = |path: &str, message: String| Problem {
        path: path.into(),
        message,
    };
    let mut table: toml::Table = base
        .parse()
        .map_err(|e: toml::de::Error| vec![problem("", e.to_string().trim().replace('\n', " "))])?;
    let section = |table: &mut toml::Table, name: &str| -> Result<toml::Table, Vec<Problem>> {
        match table.remove(name) {
            None => Ok(toml::Table::new()),
            Some(toml::Value::Table(t)) => Ok(t),
            Some(_) => Err(vec![problem(name, "must be a table".into())]),
        }
    };
    let table_of = |pairs: &[(&str, toml::Value)]| {
        let mut t = toml::Table::new();
        for (k, v) in pairs {
            t.insert(k.to_string(), v.clone());
        }
        toml::Value::Table(t)
    };

    let mut server = section(&mut table, "server")?;
    server.insert("listen".into(), listen.to_string().into());
    server.remove("insecure_http");
    server.insert("tls".into(), table_of(&[("self_signed", true.into())]));
    table.insert("server".into(), toml::Value::Table(server));
    table.insert(
        "store".into(),
        table_of(&[("kind", "sqlite".into()), ("path", db_path.into())]),
    );
    let mut upstreams = section(&mut table, "upstreams")?;
    let target = toml::Value::String(format!("http://{clusters}"));
    upstreams.insert(
        "clusters".into(),
        table_of(&[("targets", toml::Value::Array(vec![target]))]),
    );
    table.insert("upstreams".into(), toml::Value::Table(upstreams));
    table.insert("admin".into(), table_of(&[("enabled", false.into())]));

    let text = toml::to_string(&table).map_err(|e| vec![problem("", e.to_string())])?;
    Settings::parse(&text)
}

/// Runs the demo until Ctrl-C (or SIGTERM). `config` names a file whose
/// routes, roles and policies replace the shipped ones.
pub async fn run(args: &DemoArgs, config: Option<&Path>) -> Result<(), Failure> {
    let (base, file) = base_config(config)?;
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
    let settings = demo_settings(&base, args.listen, &db.to_string_lossy(), clusters_addr)
        .map_err(|problems| {
            let e = ConfigError {
                file: file.to_path_buf(),
                problems,
            };
            Failure::input(e.to_string())
        })?;

    let (stop_clusters, clusters) = spawn_clusters(clusters_listener, args.busy_for);

    let limit = clusters_limit(&settings);
    let (running, seeded) = match start_seeded(settings).await {
        Ok(started) => started,
        Err(f) => {
            let _ = stop_clusters.send(());
            let _ = clusters.await;
            return Err(f);
        }
    };
    let serving = Serving {
        addr: running.addr,
        config,
        busy_for: args.busy_for,
        limit,
    };
    welcome::print(&serving, &seeded);

    // Ctrl-C or SIGTERM: either way the temporary store is removed.
    signals.stop().await;
    eprintln!("\nstopping…");
    running.stop().await;
    let _ = stop_clusters.send(());
    let _ = clusters.await;
    Ok(())
}

/// The configuration file's text, and the name its problems are reported
/// under: the shipped one's unless `config` names another.
fn base_config(config: Option<&Path>) -> Result<(Cow<'_, str>, &Path), Failure> {
    Ok(match config {
        None => (
            SHIPPED_CONFIG.into(),
            Path::new("config/gateway.toml (built in)"),
        ),
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                Failure::input(format!("{}: cannot read the file: {e}", path.display()))
            })?;
            (text.into(), path)
        }
    })
}

/// Serves the demo clusters service on `listener` until the sender
/// returned is used (or dropped).
fn spawn_clusters(
    listener: TcpListener,
    busy_for: Duration,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
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
        listener,
        None,
        limits,
        Arc::new(DemoClusters::seeded(ORG, busy_for)),
        async {
            let _ = stopped.await;
        },
    ));
    (stop_clusters, clusters)
}

/// Opens and seeds the demo's store, then starts the gateway on it.
async fn start_seeded(settings: Settings) -> Result<(crate::app::Running, Seeded), Failure> {
    let store = crate::app::open_store(&settings, false)
        .await
        .map_err(|e| Failure::runtime(e.to_string()))?;
    let seeded = seed(&store).await?;
    let running = crate::app::start(settings, None)
        .await
        .map_err(|e| Failure::runtime(e.to_string()))?;
    Ok((running, seeded))
}

/// The rate limit of `GET /api/v1/clusters`, which the printed 429 loop spends.
fn clusters_limit(settings: &Settings) -> Option<QuotaSettings> {
    let route = settings
        .routes
        .iter()
        .find(|r| r.method == http::Method::GET && r.path == "/api/v1/clusters")?;
    let policy = settings.rate_limit.policies.get(route.rate_limit?)?;
    Some(policy.quota)
}

/// Organization `acme`, its owner `alice`, her session token, and two keys:
/// one that may read and write clusters, one that may only read them.
async fn seed(store: &crate::store::sql::SqlStore) -> Result<Seeded, Failure> {
    store.create_organization(ORG, Some("Acme Inc.")).await?;
    store
        .create_user("alice", Some("alice@example.com"))
        .await?;
    store.set_member(ORG, "alice", "owner").await?;
    let (session, _) = store
        .create_session("alice", Duration::from_secs(12 * 3600))
        .await?;
    let key = |name: &str, scopes: &[&str]| NewApiKey {
        organization_id: ORG.into(),
        user_id: "alice".into(),
        name: name.into(),
        scopes: scopes.iter().map(|s| s.to_string()).collect(),
        expires_at: None,
        rate_limit: None,
        controls: Default::default(),
    };
    let (write_key, _) = store
        .create_api_key(key("demo read-write", &["clusters:read", "clusters:write"]))
        .await?;
    let (read_key, read_record) = store
        .create_api_key(key("demo read-only", &["clusters:read"]))
        .await?;
    Ok(Seeded {
        session,
        write_key,
        read_key,
        read_key_id: read_record.id,
    })
}
