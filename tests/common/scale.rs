//! Scale-out test helpers: a PostgreSQL database per test, a Redis key prefix per
//! test, gateway configs pointing at them, a TCP proxy a test can cut, and a
//! reader for the admin listener's Prometheus metrics.

use super::TestConfig;
use sqlx::{AssertSqlSafe, Connection, Executor, PgConnection};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The admin url per-test databases are created from.
pub fn pg_admin_url() -> String {
    std::env::var("MPG_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// The machine's Redis.
pub fn redis_url() -> String {
    std::env::var("MPG_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// `url` with its database replaced by `db` (query string kept).
pub fn with_database(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let root = match base[scheme_end..].find('/') {
        Some(i) => &base[..scheme_end + i],
        None => base,
    };
    match query {
        Some(q) => format!("{root}/{db}?{q}"),
        None => format!("{root}/{db}"),
    }
}

/// `host:port` of a `scheme://[user@]host:port/...` url.
pub fn host_port(url: &str) -> SocketAddr {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    let hp = rest.split(['/', '?']).next().unwrap_or(rest);
    let hp = hp.replace("localhost", "127.0.0.1");
    hp.parse()
        .unwrap_or_else(|e| panic!("{hp} is not host:port: {e}"))
}

/// `url` with its `host:port` replaced by `addr` (for pointing through a proxy).
pub fn via(url: &str, addr: SocketAddr) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let (user, rest) = match rest.rsplit_once('@') {
        Some((u, r)) => (format!("{u}@"), r),
        None => (String::new(), rest),
    };
    let cut = rest.find(['/', '?']).unwrap_or(rest.len());
    format!("{scheme}://{user}{addr}{}", &rest[cut..])
}

/// A PostgreSQL database `mpg_test_<random>` that lives as long as this value.
pub struct PgDb {
    pub name: String,
    pub url: String,
}

impl PgDb {
    pub async fn create() -> PgDb {
        let name = format!("mpg_test_{:016x}", rand::random::<u64>());
        let mut admin = PgConnection::connect(&pg_admin_url())
            .await
            .unwrap_or_else(|e| panic!("connect to MPG_TEST_PG_URL: {e}"));
        admin
            .execute(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .await
            .unwrap();
        let _ = admin.close().await;
        let url = with_database(&pg_admin_url(), &name);
        PgDb { name, url }
    }
}

impl Drop for PgDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop may run inside a runtime: clean up on a thread of its own.
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                if let Ok(mut admin) = PgConnection::connect(&pg_admin_url()).await {
                    let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                    let _ = admin.execute(AssertSqlSafe(sql)).await;
                    let _ = admin.close().await;
                }
            });
        })
        .join();
    }
}

/// A fresh Redis key prefix; its keys are deleted on drop.
pub struct RedisPrefix(pub String);

impl RedisPrefix {
    pub fn new() -> RedisPrefix {
        RedisPrefix(format!("mpgtest:{:016x}:", rand::random::<u64>()))
    }

    /// The keys Redis holds under this prefix now: proof that a limiter's
    /// decisions were Redis's, not a fallback's.
    pub fn keys(&self) -> Vec<String> {
        let client = redis::Client::open(redis_url()).unwrap();
        let mut conn = client.get_connection().unwrap();
        redis::cmd("KEYS")
            .arg(format!("{}*", self.0))
            .query(&mut conn)
            .unwrap()
    }
}

impl Drop for RedisPrefix {
    fn drop(&mut self) {
        let pattern = format!("{}*", self.0);
        let _ = std::thread::spawn(move || {
            let Ok(client) = redis::Client::open(redis_url()) else {
                return;
            };
            let Ok(mut conn) = client.get_connection() else {
                return;
            };
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(&pattern)
                .query(&mut conn)
                .unwrap_or_default();
            if !keys.is_empty() {
                let _: Result<(), _> = redis::cmd("DEL").arg(keys).query(&mut conn);
            }
        })
        .join();
    }
}

impl TestConfig {
    /// Points the store at PostgreSQL `url`.
    pub fn postgres(&mut self, url: &str) -> &mut Self {
        self.remove("store.path");
        self.set("store.kind", "postgres");
        self.set("store.url", url);
        self
    }

    /// The Redis limiter at `url` under `prefix`.
    pub fn redis(&mut self, url: &str, prefix: &str) -> &mut Self {
        self.set("rate_limit.backend", "redis");
        self.set("rate_limit.redis_url", url);
        self.set("rate_limit.redis_prefix", prefix);
        self
    }

    /// The admin listener on a port of its own (for `/metrics`).
    pub fn admin_on(&mut self) -> &mut Self {
        self.set("admin.enabled", true);
        self.set("admin.listen", "127.0.0.1:0");
        self
    }

    /// Writes to `name` in the config's temp dir (several configs per test).
    pub fn write_as(&self, name: &str) -> std::path::PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, toml::to_string(&self.table).unwrap()).unwrap();
        path
    }
}

/// What the proxy does with connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ProxyMode {
    /// Forwards bytes both ways.
    Open = 0,
    /// Closes every connection (existing ones at once, new ones on accept).
    Cut = 1,
    /// Accepts and never answers (a store that hangs).
    Blackhole = 2,
    /// Closes every connection and stops listening: connects are refused
    /// (RST) in well under a millisecond, as to a server that is down.
    Refuse = 3,
}

/// A TCP proxy on 127.0.0.1 to `target` that a test can cut and restore.
pub struct TcpProxy {
    pub addr: SocketAddr,
    target: SocketAddr,
    mode: Arc<AtomicU8>,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
    /// The accept loop (owns the listener); None while refusing.
    accept: Mutex<Option<JoinHandle<()>>>,
}

impl TcpProxy {
    pub async fn start(target: SocketAddr) -> TcpProxy {
        // A port below the ephemeral range: no outgoing connection can take
        // it while the proxy refuses, so it can listen there again.
        let listener = loop {
            let port = rand::random_range(20_000..32_000);
            if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
                break l;
            }
        };
        let addr = listener.local_addr().unwrap();
        let proxy = TcpProxy {
            addr,
            target,
            mode: Arc::new(AtomicU8::new(ProxyMode::Open as u8)),
            conns: Arc::default(),
            accept: Mutex::new(None),
        };
        proxy.listen(listener);
        proxy
    }

    /// Runs the accept loop on `listener`.
    fn listen(&self, listener: std::net::TcpListener) {
        listener.set_nonblocking(true).unwrap();
        let listener = TcpListener::from_std(listener).unwrap();
        let (m, c, target) = (self.mode.clone(), self.conns.clone(), self.target);
        let accept = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    continue;
                };
                let task = match m.load(Ordering::SeqCst) {
                    0 => tokio::spawn(async move {
                        if let Ok(mut outbound) = TcpStream::connect(target).await {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    }),
                    2 => tokio::spawn(async move {
                        let _keep = inbound;
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                    }),
                    _ => {
                        drop(inbound);
                        continue;
                    }
                };
                let mut conns = c.lock().unwrap();
                conns.retain(|t| !t.is_finished());
                conns.push(task);
            }
        });
        *self.accept.lock().unwrap() = Some(accept);
    }

    /// Switches mode; leaving `Open` drops every connection in flight.
    pub fn set(&self, mode: ProxyMode) {
        self.mode.store(mode as u8, Ordering::SeqCst);
        if mode != ProxyMode::Open {
            for task in self.conns.lock().unwrap().drain(..) {
                task.abort();
            }
        }
        let listening = self.accept.lock().unwrap().is_some();
        if mode == ProxyMode::Refuse {
            if let Some(accept) = self.accept.lock().unwrap().take() {
                accept.abort();
            }
        } else if !listening {
            // The aborted loop drops its listener within moments.
            for _ in 0..2_000 {
                if let Ok(listener) = std::net::TcpListener::bind(self.addr) {
                    return self.listen(listener);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            panic!("proxy could not listen on {} again", self.addr);
        }
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        if let Some(accept) = self.accept.lock().unwrap().take() {
            accept.abort();
        }
        for task in self.conns.lock().unwrap().drain(..) {
            task.abort();
        }
    }
}

/// The admin listener's `/metrics` text.
pub async fn metrics(admin: SocketAddr) -> String {
    super::client()
        .get(format!("http://{admin}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// Sum of every sample of `name` whose labels contain all of `labels` (`k="v"` strings).
///
/// The metric itself must be exported (a sample of any labels): a renamed or
/// unregistered metric fails the test instead of reading as zero. Only a
/// label combination that never occurred reads as zero.
pub fn metric_sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    let exported = text.lines().filter(|l| !l.starts_with('#')).any(|l| {
        l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b'{') | Some(b' '))
    });
    assert!(exported, "metric {name} is not exported:\n{text}");
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b'{') | Some(b' '))
        })
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

/// Polls `check` every 20 ms until it holds or `limit` passes; returns the time it took.
pub async fn within<F, Fut>(limit: Duration, mut check: F) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = std::time::Instant::now();
    loop {
        if check().await {
            return Some(started.elapsed());
        }
        if started.elapsed() > limit {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
