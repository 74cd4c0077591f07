//! Test harness: a recording upstream on port 0, the real `mpg-gateway`
//! binary started on port 0 with a generated config (its log captured), the
//! admin CLI, and a raw-socket client for targets a normal client would fix.
#![allow(dead_code, unreachable_pub)]

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub const BIN: &str = env!("CARGO_BIN_EXE_mpg-gateway");
pub const SHIPPED_CONFIG: &str = include_str!("../../config/gateway.toml");

/// One request as the upstream saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub uri: String,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

/// A real HTTP/1.1 upstream on 127.0.0.1:0 that records what reaches it.
///
/// Paths: `/api/v1/slow` sleeps 3 s; `/api/v1/busy` answers 409 with
/// `Retry-After: 7`; `/api/v1/large` answers [`LARGE_BODY`] bytes of
/// [`large_body`]; anything else echoes the request as JSON.
pub struct MockUpstream {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl MockUpstream {
    pub async fn start() -> MockUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let record = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let record = record.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let record = record.clone();
                        async move { Ok::<_, std::convert::Infallible>(answer(req, record).await) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        MockUpstream { addr, seen, task }
    }

    pub fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// Waits until the upstream has seen `n` requests (it records one as
    /// soon as its body is read, before answering); panics after 10 s.
    pub async fn until_count(&self, n: usize) {
        let seen = scale::within(Duration::from_secs(10), || async { self.count() >= n }).await;
        assert!(
            seen.is_some(),
            "the upstream saw {} requests, not {n}",
            self.count()
        );
    }

    pub fn last(&self) -> Seen {
        self.seen
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("upstream saw no request")
    }
}

impl Drop for MockUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Seconds since the epoch, by this machine's clock (the gateway's too).
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_secs() as i64
}

/// The length of the mock upstream's `/api/v1/large` answer.
pub const LARGE_BODY: usize = 4 * 1024 * 1024;

/// The mock upstream's `/api/v1/large` answer: lines of digits, so that a
/// client's copy can be checked byte for byte.
pub fn large_body() -> Bytes {
    let line = b"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde\n";
    line.iter()
        .copied()
        .cycle()
        .take(LARGE_BODY)
        .collect::<Vec<u8>>()
        .into()
}

async fn answer(req: Request<Incoming>, record: Arc<Mutex<Vec<Seen>>>) -> Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let path = parts.uri.path().to_string();
    record.lock().unwrap().push(Seen {
        method: parts.method.to_string(),
        uri: parts.uri.to_string(),
        headers: parts.headers.clone(),
        body: body.clone(),
    });
    match path.as_str() {
        "/api/v1/slow" => {
            tokio::time::sleep(Duration::from_secs(3)).await;
            Response::new(Full::new(Bytes::from_static(b"late")))
        }
        "/api/v1/large" => Response::builder()
            .header("content-type", "text/plain")
            .body(Full::new(large_body()))
            .unwrap(),
        "/api/v1/busy" => Response::builder()
            .status(StatusCode::CONFLICT)
            .header("retry-after", "7")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(
                b"{\"error\":\"Conflict\",\"message\":\"cluster is still changing\"}",
            )))
            .unwrap(),
        _ => {
            let headers: serde_json::Map<String, Value> = parts
                .headers
                .iter()
                .map(|(k, v)| {
                    (
                        k.to_string(),
                        Value::String(v.to_str().unwrap_or("").to_string()),
                    )
                })
                .collect();
            let v = json!({ "method": parts.method.as_str(), "uri": parts.uri.to_string(), "headers": headers, "body_len": body.len() });
            Response::builder()
                .header("content-type", "application/json")
                .header("connection", "x-upstream-hop")
                .header("x-upstream-hop", "must be removed")
                .body(Full::new(Bytes::from(v.to_string())))
                .unwrap()
        }
    }
}

/// A 200 with a two-byte body, for [`Target`].
pub const OK: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
/// A 500 with no body, for [`Target`].
pub const FAIL: &[u8] = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n";

/// A raw upstream target answering every request head with `answer` after
/// `delay` (or, made with [`Target::slow_body`], with its head at once and
/// its body after `delay`), on kept-alive connections, counting the connections it accepted
/// and the requests it read. Stopping it (or dropping it) closes its port
/// and every connection it has open; [`Target::restart`] listens on the
/// same port again.
pub struct Target {
    pub addr: SocketAddr,
    pub accepts: Arc<std::sync::atomic::AtomicUsize>,
    pub requests: Arc<std::sync::atomic::AtomicUsize>,
    answer: &'static [u8],
    delay: Duration,
    head_first: bool,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Target {
    /// A target on 127.0.0.1:0.
    pub async fn start(answer: &'static [u8], delay: Duration) -> Target {
        Self::bind(answer, delay, false).await
    }

    /// A target on 127.0.0.1:0 that sends the head of `answer` at once and
    /// its body `delay` later.
    pub async fn slow_body(answer: &'static [u8], delay: Duration) -> Target {
        Self::bind(answer, delay, true).await
    }

    async fn bind(answer: &'static [u8], delay: Duration, head_first: bool) -> Target {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut t = Target {
            addr: listener.local_addr().unwrap(),
            accepts: Arc::default(),
            requests: Arc::default(),
            answer,
            delay,
            head_first,
            task: None,
        };
        t.serve(listener);
        t
    }

    /// Closes the port and every open connection: connects are refused.
    pub fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }

    /// Listens on the same port again (after [`Target::stop`]).
    pub async fn restart(&mut self) {
        self.stop();
        let listener = TcpListener::bind(self.addr).await.unwrap();
        self.serve(listener);
    }

    pub fn requests(&self) -> usize {
        self.requests.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn serve(&mut self, listener: TcpListener) {
        let (a, r) = (self.accepts.clone(), self.requests.clone());
        let (answer, delay) = (self.answer, self.delay);
        let split = match self.head_first {
            true => answer
                .windows(4)
                .position(|w| w == b"\r\n\r\n")
                .map_or(0, |i| i + 4),
            false => 0,
        };
        let (head, body) = answer.split_at(split);
        self.task = Some(tokio::spawn(async move {
            // Its connections end with it: dropping the set aborts them.
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((mut s, _)) = listener.accept().await {
                a.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let r = r.clone();
                connections.spawn(async move {
                    let mut buf = vec![0u8; 8192];
                    let mut got = Vec::new();
                    loop {
                        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                            match s.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => got.extend_from_slice(&buf[..n]),
                            }
                        }
                        got.clear();
                        r.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        if s.write_all(head).await.is_err() {
                            return;
                        }
                        tokio::time::sleep(delay).await;
                        if s.write_all(body).await.is_err() {
                            return;
                        }
                    }
                });
                while connections.try_join_next().is_some() {}
            }
        }));
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A [`Target`] on 127.0.0.1:0 that runs for the rest of the test: its
/// address, the connections it accepted and the requests it read.
pub async fn counting_target(
    answer: &'static [u8],
    delay: Duration,
) -> (
    SocketAddr,
    Arc<std::sync::atomic::AtomicUsize>,
    Arc<std::sync::atomic::AtomicUsize>,
) {
    let mut t = Target::start(answer, delay).await;
    // Detached: a dropped JoinHandle leaves its task running.
    drop(t.task.take());
    (t.addr, t.accepts.clone(), t.requests.clone())
}

/// A config file built from the shipped route table, plain HTTP on port 0.
pub struct TestConfig {
    pub table: toml::Table,
    pub dir: tempfile::TempDir,
}

impl TestConfig {
    /// The shipped routes, `clusters` pointing at `upstream`, SQLite in a temp dir.
    pub fn new(upstream: SocketAddr) -> TestConfig {
        let dir = tempfile::tempdir().unwrap();
        let mut table: toml::Table = SHIPPED_CONFIG.parse().unwrap();
        let mut c = TestConfig { table, dir };
        c.set("server.listen", "127.0.0.1:0");
        c.set("server.insecure_http", true);
        c.remove("server.tls");
        c.set("admin.enabled", false);
        c.set("log.format", "json");
        c.set(
            "log.level",
            "debug,hyper=info,h2=info,sqlx=warn,rustls=info",
        );
        let db = c.dir.path().join("gateway.db");
        c.set("store.path", db.to_str().unwrap());
        c.set(
            "upstreams.clusters.targets",
            vec![format!("http://{upstream}")],
        );
        table = std::mem::take(&mut c.table);
        c.table = table;
        c
    }

    /// Sets a dotted path (tables are created as needed).
    pub fn set(&mut self, path: &str, value: impl Into<toml::Value>) -> &mut Self {
        let keys: Vec<&str> = path.split('.').collect();
        let mut t = &mut self.table;
        for k in &keys[..keys.len() - 1] {
            t = t
                .entry(k.to_string())
                .or_insert_with(|| toml::Value::Table(Default::default()))
                .as_table_mut()
                .unwrap();
        }
        t.insert(keys[keys.len() - 1].to_string(), value.into());
        self
    }

    pub fn remove(&mut self, path: &str) -> &mut Self {
        let keys: Vec<&str> = path.split('.').collect();
        let mut t = &mut self.table;
        for k in &keys[..keys.len() - 1] {
            t = t.get_mut(*k).unwrap().as_table_mut().unwrap();
        }
        t.remove(keys[keys.len() - 1]);
        self
    }

    /// Serves TLS from a fresh self-signed PEM pair written to the temp dir
    /// (`cert.pem`, `key.pem`): their paths, to replace them for a reload.
    pub fn tls_files(&mut self) -> (PathBuf, PathBuf) {
        let (cert, key) = mpg_gateway::tls::self_signed_pem().unwrap();
        let c = self.dir.path().join("cert.pem");
        let k = self.dir.path().join("key.pem");
        std::fs::write(&c, cert).unwrap();
        std::fs::write(&k, key).unwrap();
        self.set("server.insecure_http", false);
        self.set("server.tls.cert", c.to_str().unwrap());
        self.set("server.tls.key", k.to_str().unwrap());
        (c, k)
    }

    /// Appends a `[[routes]]` entry written as inline TOML (`method = "GET"` …).
    pub fn route(&mut self, fields: &str) -> &mut Self {
        let route: toml::Table = fields.parse().unwrap();
        self.table
            .get_mut("routes")
            .unwrap()
            .as_array_mut()
            .unwrap()
            .push(toml::Value::Table(route));
        self
    }

    pub fn write(&self) -> PathBuf {
        let path = self.dir.path().join("gateway.toml");
        std::fs::write(&path, toml::to_string(&self.table).unwrap()).unwrap();
        path
    }
}

/// Runs an admin command; returns (exit code, stdout parsed as JSON or Null, stderr).
pub fn cli(config: &Path, args: &[&str]) -> (i32, Value, String) {
    let out = Command::new(BIN)
        .arg("--config")
        .arg(config)
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let json = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    (
        out.status.code().unwrap_or(-1),
        json,
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// Like `cli` but panics unless it succeeds; returns stdout JSON.
pub fn cli_ok(config: &Path, args: &[&str]) -> Value {
    let (code, json, err) = cli(config, args);
    assert_eq!(code, 0, "{args:?} failed: {err}");
    json
}

/// [`cli`] off the async runtime's threads, for tests that keep a gateway running.
pub async fn admin(config: &Path, args: &[&str]) -> (i32, Value, String) {
    let config = config.to_path_buf();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        cli(&config, &args)
    })
    .await
    .unwrap()
}

/// [`admin`] that must succeed; returns stdout JSON.
pub async fn admin_ok(config: &Path, args: &[&str]) -> Value {
    let (code, json, err) = admin(config, args).await;
    assert_eq!(code, 0, "{args:?} failed: {err}");
    json
}

/// [`admin`] that must exit 2 with a message holding `words`.
pub async fn refused(config: &Path, args: &[&str], words: &str) {
    let (code, out, err) = admin(config, args).await;
    assert_eq!(code, 2, "{args:?} was accepted: {out}");
    assert!(err.contains(words), "{args:?}: {err}");
}

/// Organization, user, membership, session and key, made with the CLI.
pub struct Seed {
    pub session: String,
    pub key: String,
    pub key_id: String,
}

pub fn seed(config: &Path, org: &str, user: &str, role: &str, scopes: &str) -> Seed {
    let _ = cli(config, &["orgs", "create", "--id", org]);
    let _ = cli(config, &["users", "create", "--id", user]);
    cli_ok(
        config,
        &[
            "members", "add", "--org", org, "--user", user, "--role", role,
        ],
    );
    let session = cli_ok(config, &["sessions", "create", "--user", user]);
    let (key, key_id) = create_key(config, org, user, scopes);
    Seed {
        session: session["token"].as_str().unwrap().to_string(),
        key,
        key_id,
    }
}

/// A new API key of `user` in `org` with `scopes` (comma-separated), made with
/// `mpg-gateway keys create`: (secret, key id).
pub fn create_key(config: &Path, org: &str, user: &str, scopes: &str) -> (String, String) {
    let key = cli_ok(
        config,
        &[
            "keys", "create", "--org", org, "--user", user, "--name", "test", "--scopes", scopes,
        ],
    );
    (
        key["key"].as_str().unwrap().to_string(),
        key["id"].as_str().unwrap().to_string(),
    )
}

/// The real gateway process; killed on drop. Its stderr (JSON log lines) is kept.
pub struct Gateway {
    pub addr: SocketAddr,
    pub admin: Option<SocketAddr>,
    pub child: Child,
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Gateway {
    pub fn start(config: &Path) -> Gateway {
        Self::try_start(config).unwrap_or_else(|log| panic!("gateway did not start:\n{log}"))
    }

    pub fn try_start(config: &Path) -> Result<Gateway, String> {
        let mut child = Command::new(BIN)
            .arg("run")
            .arg("--config")
            .arg(config)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let log: Arc<Mutex<Vec<String>>> = Arc::default();
        let (tx, rx) = std::sync::mpsc::channel::<SocketAddr>();
        let admin_seen: Arc<Mutex<Option<SocketAddr>>> = Arc::default();
        let admin_sink = admin_seen.clone();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    if v["message"] == "admin listening" {
                        *admin_sink.lock().unwrap() =
                            v["addr"].as_str().and_then(|a| a.parse().ok());
                    }
                    if v["message"] == "listening" {
                        if let Some(addr) = v["addr"].as_str().and_then(|a| a.parse().ok()) {
                            let _ = tx.send(addr);
                        }
                    }
                }
                sink.lock().unwrap().push(line);
            }
        });
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(addr) => {
                let admin = *admin_seen.lock().unwrap();
                Ok(Gateway {
                    addr,
                    admin,
                    child,
                    log,
                })
            }
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                std::thread::sleep(Duration::from_millis(100));
                Err(log.lock().unwrap().join("\n"))
            }
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Everything the process has logged so far.
    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        signal(self.child.id(), "TERM");
        self.child.wait().unwrap()
    }
}

/// Sends signal `name` (`TERM`, `HUP`, …) to process `pid`.
pub fn signal(pid: u32, name: &str) {
    let sent = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(sent.success(), "kill -{name} {pid}");
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain reqwest client (no redirects, no proxies).
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// `GET /public/ping` (a route tests add, `auth = "none"`): the status.
pub async fn ping(gw: &Gateway) -> u16 {
    client()
        .get(gw.url("/public/ping"))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// `gw`'s `/readyz` body (its admin listener must be on).
pub async fn readyz(gw: &Gateway) -> Value {
    let admin = gw.admin.expect("the admin listener is on");
    client()
        .get(format!("http://{admin}/readyz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Sends `req` with `body` as JSON, if any: (status, body as JSON or Null).
pub async fn exchange(mut req: reqwest::RequestBuilder, body: Option<Value>) -> (u16, Value) {
    if let Some(b) = body {
        req = req.json(&b);
    }
    let res = req.send().await.unwrap();
    let status = res.status().as_u16();
    let text = res.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// The status and `details.reason` `key` gets on `GET /api/v1/clusters?organization_id=acme`.
pub async fn use_key(gw: &Gateway, key: &str) -> (u16, Value) {
    let res = client()
        .get(gw.url("/api/v1/clusters?organization_id=acme"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    let body: Value = res.json().await.unwrap_or(Value::Null);
    (status, body["details"]["reason"].clone())
}

/// A parsed raw HTTP/1.1 response.
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

/// Writes `raw` bytes as-is and reads one response (connection closed after).
pub async fn raw(addr: SocketAddr, raw: &[u8]) -> RawResponse {
    raw_exchange(addr, raw).await.0
}

/// Writes `raw` bytes as-is (a write the server cuts short is not an
/// error) and reads until the server closes the connection, for at most
/// 5 s: the response (whatever followed its head is its body), and whether
/// the server closed the connection.
pub async fn raw_exchange(addr: SocketAddr, raw: &[u8]) -> (RawResponse, bool) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let _ = s.write_all(raw).await;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await
    .is_ok();
    (RawResponse::parse(&buf), closed)
}

impl RawResponse {
    /// The first response in `bytes`; status 0 when there is none.
    pub fn parse(bytes: &[u8]) -> RawResponse {
        let text = String::from_utf8_lossy(bytes).to_string();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let mut lines = head.lines();
        let status = lines
            .next()
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let headers = lines
            .filter_map(|l| {
                l.split_once(':')
                    .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            })
            .collect();
        RawResponse {
            status,
            headers,
            body: body.to_string(),
        }
    }
}

/// `GET target` with the given extra header lines, `Connection: close`.
pub async fn raw_get(addr: SocketAddr, target: &str, headers: &str) -> RawResponse {
    let req =
        format!("GET {target} HTTP/1.1\r\nHost: {addr}\r\n{headers}Connection: close\r\n\r\n");
    raw(addr, req.as_bytes()).await
}

/// Runs each named `async fn case(pg: bool)` of the test file as two
/// tests, `sqlite::case` and `postgres::case`.
#[macro_export]
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test]
            async fn $name() {
                super::$name(false).await
            })*
        }
        mod postgres {
            $(#[tokio::test]
            async fn $name() {
                super::$name(true).await
            })*
        }
    };
}

// === scale-out helpers (PostgreSQL databases, Redis prefixes, a cuttable TCP proxy) ===
pub mod scale;

// === an OTLP receiver, for the tracing tests ===
pub mod otlp;

// === an HTTP/2 client (prior knowledge, the `h2` crate) ===
pub mod h2c;

// === the admin API with an admin token ===
pub mod admin;

// === servers a test starts for itself: TLS Redis, Redis Cluster, TLS PostgreSQL ===
pub mod backends;

/// A running gateway and its recording upstream, for tests that attack it or
/// speak raw HTTP to it.
pub struct World {
    pub up: MockUpstream,
    pub cfg: TestConfig,
    pub gw: Gateway,
    pub seed: Seed,
}

/// The shipped routes plus an open `/public/ping` and a `POST /api/v1/clusters`;
/// limits high enough that hundreds of hostile requests are not throttled.
pub async fn world() -> World {
    world_with(|_| {}).await
}

pub async fn world_with(tune: impl FnOnce(&mut TestConfig)) -> World {
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    cfg.set("rate_limit.policies.default.requests", 100_000);
    cfg.set("rate_limit.policies.default.per", "1m");
    cfg.set("rate_limit.auth_failures.requests", 100_000);
    cfg.set("rate_limit.auth_failures.per", "1m");
    cfg.route("method = \"GET\"\npath = \"/public/ping\"\nauth = \"none\"\nupstream = \"clusters\"\nrate_limit = \"none\"");
    tune(&mut cfg);
    let path = cfg.write();
    let seed = seed(
        &path,
        "acme",
        "alice",
        "owner",
        "clusters:read,clusters:write",
    );
    let gw = Gateway::start(&path);
    World { up, cfg, gw, seed }
}

/// Accepts any server certificate and remembers the last one seen.
#[derive(Debug)]
struct Remember(Arc<Mutex<Vec<u8>>>);

impl rustls::client::danger::ServerCertVerifier for Remember {
    fn verify_server_cert(
        &self,
        end_entity: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        *self.0.lock().unwrap() = end_entity.to_vec();
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        rustls::crypto::aws_lc_rs::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A TLS connector offering `provider`'s suites in its order and ALPN
/// `alpn`, trusting any certificate and putting the last one seen in `seen`.
pub fn tls_connector(
    provider: rustls::crypto::CryptoProvider,
    alpn: &[u8],
    seen: Arc<Mutex<Vec<u8>>>,
) -> tokio_rustls::TlsConnector {
    let config = tls_client_config(provider, rustls::DEFAULT_VERSIONS, alpn, seen);
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// The client config of [`tls_connector`], limited to `versions`: fields
/// such as `resumption` can be changed before it is used.
pub fn tls_client_config(
    provider: rustls::crypto::CryptoProvider,
    versions: &[&'static rustls::SupportedProtocolVersion],
    alpn: &[u8],
    seen: Arc<Mutex<Vec<u8>>>,
) -> rustls::ClientConfig {
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(versions)
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Remember(seen)))
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    config
}

/// A TLS connection to `addr` offering `provider`'s suites in its order and
/// ALPN `http/1.1`, trusting any certificate: the stream, and the certificate
/// the server showed.
pub async fn tls_connect(
    addr: SocketAddr,
    provider: rustls::crypto::CryptoProvider,
) -> (tokio_rustls::client::TlsStream<TcpStream>, Vec<u8>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let connector = tls_connector(provider, b"http/1.1", seen.clone());
    let tcp = TcpStream::connect(addr).await.unwrap();
    let stream = connector
        .connect("localhost".try_into().unwrap(), tcp)
        .await
        .unwrap();
    let cert = seen.lock().unwrap().clone();
    (stream, cert)
}
