//! The interop matrix: real clients on this machine, each over the protocols
//! it speaks, against every kind of answer the gateway gives: a small 200, a
//! large streamed 200, the refusals sent while the client is still uploading
//! (401, 403, 404, 405, 413, 429), and 502, 503 and 504 from a dead, an
//! ejected and a slow upstream. Each client must see the status and the
//! whole body (the JSON error body, by its `error` name).
//!
//! The clients run as child processes, several at once, each within a time
//! bound. A missing client fails the test, naming the package to install:
//! curl (`curl`), Node.js 18 or later (`nodejs`), nghttp and h2load
//! (`nghttp2-client`). docs/http.md says which versions were run.
mod common;

use common::*;
use serde_json::Value;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::process::Command;
use tokio::sync::Semaphore;

const MIB: usize = 1024 * 1024;
/// `server.limits.max_body_bytes`.
const MAX_BODY: usize = 3 * MIB;
/// The refused uploads: past HTTP/2's 1 MiB windows, so the answer comes
/// while the client is still sending, and within `MAX_BODY`.
const UPLOAD: usize = 2 * MIB;
/// The upload refused for its size (413).
const OVERSIZED: usize = 4 * MIB;
/// Each client run's bound.
const RUN_TIMEOUT: Duration = Duration::from_secs(20);
/// Client runs at once.
const PARALLEL: usize = 6;

/// A client, and the protocol it speaks to the gateway.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Client {
    /// curl over HTTP/1.1, with its own `Expect: 100-continue` for large bodies.
    CurlH1,
    /// curl over HTTP/1.1 sending the body at once (`Expect:` turned off).
    CurlH1NoExpect,
    CurlH2Tls,
    CurlH2c,
    /// Node's `fetch` (undici; HTTP/1.1).
    NodeFetch,
    NodeHttp2H2c,
    NodeHttp2Tls,
    NghttpH2c,
    NghttpTls,
}

impl Client {
    const ALL: [Client; 9] = [
        Client::CurlH1,
        Client::CurlH1NoExpect,
        Client::CurlH2Tls,
        Client::CurlH2c,
        Client::NodeFetch,
        Client::NodeHttp2H2c,
        Client::NodeHttp2Tls,
        Client::NghttpH2c,
        Client::NghttpTls,
    ];

    fn name(self) -> &'static str {
        match self {
            Client::CurlH1 => "curl h1",
            Client::CurlH1NoExpect => "curl h1 (no Expect)",
            Client::CurlH2Tls => "curl h2 (TLS)",
            Client::CurlH2c => "curl h2c",
            Client::NodeFetch => "node fetch h1",
            Client::NodeHttp2H2c => "node:http2 h2c",
            Client::NodeHttp2Tls => "node:http2 h2 (TLS)",
            Client::NghttpH2c => "nghttp h2c",
            Client::NghttpTls => "nghttp h2 (TLS)",
        }
    }

    fn tls(self) -> bool {
        matches!(
            self,
            Client::CurlH2Tls | Client::NodeHttp2Tls | Client::NghttpTls
        )
    }
}

/// What a 2xx answer's body must be.
#[derive(Debug, Clone, Copy)]
enum Want {
    /// The mock upstream's JSON echo of the request.
    Echo,
    /// The mock upstream's large body, whole.
    Large,
    /// The gateway's JSON error body with this `error` name.
    Error(&'static str),
}

/// One kind of answer: the request that gets it and what must come back.
#[derive(Debug, Clone)]
struct Case {
    name: &'static str,
    method: &'static str,
    target: String,
    auth: Option<String>,
    /// Body bytes uploaded (0: none).
    upload: usize,
    status: u16,
    want: Want,
}

fn cases(seed: &Seed, read_only_key: &str) -> Vec<Case> {
    let clusters = "/api/v1/clusters?organization_id=acme".to_string();
    let case = |name, method, target: &str, auth: Option<&str>, upload, status, want| Case {
        name,
        method,
        target: target.to_string(),
        auth: auth.map(|k| format!("Bearer {k}")),
        upload,
        status,
        want,
    };
    let key = Some(seed.key.as_str());
    let bad = Some("mpg_notakey");
    vec![
        case("200", "GET", &clusters, key, 0, 200, Want::Echo),
        case(
            "200 large",
            "GET",
            "/api/v1/large",
            None,
            0,
            200,
            Want::Large,
        ),
        // Refused in stages 1 and 4: a name an upstream framework reads as
        // the organization parameter, and a `..;` segment.
        case(
            "400 lookalike",
            "GET",
            "/api/v1/clusters?organization_id=acme&organization.id=evil",
            key,
            0,
            400,
            Want::Error("BadRequest"),
        ),
        case(
            "400 dot-semicolon",
            "GET",
            "/api/v1/clusters/..;?organization_id=acme",
            key,
            0,
            400,
            Want::Error("BadRequest"),
        ),
        case(
            "401",
            "POST",
            &clusters,
            bad,
            UPLOAD,
            401,
            Want::Error("Unauthorized"),
        ),
        case(
            "403",
            "POST",
            &clusters,
            Some(read_only_key),
            UPLOAD,
            403,
            Want::Error("Forbidden"),
        ),
        case(
            "404",
            "POST",
            "/api/v1/nowhere",
            key,
            UPLOAD,
            404,
            Want::Error("NotFound"),
        ),
        case(
            "405",
            "PUT",
            &clusters,
            key,
            UPLOAD,
            405,
            Want::Error("MethodNotAllowed"),
        ),
        case(
            "413",
            "POST",
            &clusters,
            key,
            OVERSIZED,
            413,
            Want::Error("PayloadTooLarge"),
        ),
        case(
            "429",
            "POST",
            "/api/v1/limited",
            None,
            UPLOAD,
            429,
            Want::Error("TooManyRequests"),
        ),
        case(
            "502",
            "POST",
            "/api/v1/dead",
            None,
            UPLOAD,
            502,
            Want::Error("BadGateway"),
        ),
        case(
            "503",
            "POST",
            "/api/v1/ejected",
            None,
            UPLOAD,
            503,
            Want::Error("ServiceUnavailable"),
        ),
        case(
            "504",
            "GET",
            "/api/v1/slow",
            None,
            0,
            504,
            Want::Error("GatewayTimeout"),
        ),
    ]
}

/// A gateway (plain, or TLS with a self-signed certificate) with a route
/// for each answer, its 429 and 503 routes already spent and ejected.
async fn gateway(tls: bool, dead: std::net::SocketAddr) -> World {
    let w = world_with(|c| {
        if tls {
            c.set("server.insecure_http", false);
            c.set("server.tls.self_signed", true);
        }
        c.set("server.limits.max_body_bytes", MAX_BODY as i64);
        let mock = c.table["upstreams"]["clusters"]["targets"].clone();
        let dead = vec![format!("http://{dead}")];
        c.set("upstreams.slow.targets", mock);
        c.set("upstreams.slow.request_timeout", "300ms");
        // Every 504 would count against the target: never eject it.
        c.set("upstreams.slow.max_fails", 0);
        c.set("upstreams.dead.targets", dead.clone());
        c.set("upstreams.dead.max_fails", 0);
        c.set("upstreams.ejected.targets", dead);
        // A failing active check keeps a target out until a check passes
        // (no half-open probe lets a request through), so every request
        // to this route is a 503 once the first check has run.
        c.set("upstreams.ejected.max_fails", 1);
        c.set("upstreams.ejected.fail_timeout", "1h");
        c.set("upstreams.ejected.health_path", "/health");
        c.set("upstreams.ejected.health_interval", "1h");
        c.set("rate_limit.policies.tiny.requests", 1);
        c.set("rate_limit.policies.tiny.per", "1h");
        c.set("rate_limit.policies.tiny.key", "client_ip");
        for (method, path, upstream, limit) in [
            ("GET", "/api/v1/large", "clusters", "none"),
            ("GET", "/api/v1/slow", "slow", "none"),
            ("POST", "/api/v1/limited", "clusters", "tiny"),
            ("POST", "/api/v1/dead", "dead", "none"),
            ("POST", "/api/v1/ejected", "ejected", "none"),
        ] {
            c.route(&format!(
                "method = \"{method}\"\npath = \"{path}\"\nauth = \"none\"\nupstream = \"{upstream}\"\nrate_limit = \"{limit}\""
            ));
        }
    })
    .await;
    // Spend the one request of the 429 route, and wait for the active check
    // to take the 503 route's target out.
    let http = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let res = http
        .post(base_url(&w, tls) + "/api/v1/limited")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200, "warming up /api/v1/limited");
    let mut ejected = false;
    for _ in 0..50 {
        let res = http
            .post(base_url(&w, tls) + "/api/v1/ejected")
            .send()
            .await
            .unwrap();
        if res.status() == 503 {
            ejected = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        ejected,
        "the dead target of /api/v1/ejected was never taken out"
    );
    w
}

fn base_url(w: &World, tls: bool) -> String {
    let scheme = if tls { "https" } else { "http" };
    format!("{scheme}://127.0.0.1:{}", w.gw.addr.port())
}

/// The Node.js client: `node client.js MODE URL METHOD AUTH BYTES` prints
/// the status on a line, then the body as received.
const NODE_CLIENT: &str = r#"
const http2 = require('node:http2');
const [mode, url, method, auth, bytes] = process.argv.slice(2);
const body = Number(bytes) > 0 ? Buffer.alloc(Number(bytes), 'x') : null;
const headers = auth ? { authorization: auth } : {};
function done(status, chunks) {
  process.stdout.write(status + '\n');
  process.stdout.write(Buffer.concat(chunks));
}
if (mode === 'fetch') {
  fetch(url, { method, headers, body }).then(async (res) => {
    done(res.status, [Buffer.from(await res.arrayBuffer())]);
  }).catch((e) => { console.error('fetch failed:', e, e.cause); process.exitCode = 1; });
} else {
  const u = new URL(url);
  const session = http2.connect(u.origin, { rejectUnauthorized: false });
  session.on('error', (e) => { console.error('session error:', e); process.exitCode = 1; });
  const h = { ':method': method, ':path': u.pathname + u.search, ...headers };
  if (body) h['content-length'] = String(body.length);
  const req = session.request(h);
  let status = 0;
  const chunks = [];
  req.on('response', (r) => { status = r[':status']; });
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => { done(status, chunks); session.close(); });
  req.on('error', (e) => { console.error('stream error:', e); process.exitCode = 1; });
  req.end(body || undefined);
}
"#;

/// Files the clients read: the Node.js script and the upload bodies.
struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new() -> Files {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("client.js"), NODE_CLIENT).unwrap();
        for n in [UPLOAD, OVERSIZED] {
            std::fs::write(dir.path().join(format!("body-{n}")), vec![b'x'; n]).unwrap();
        }
        Files { dir }
    }

    fn node_script(&self) -> PathBuf {
        self.dir.path().join("client.js")
    }

    fn body(&self, n: usize) -> PathBuf {
        self.dir.path().join(format!("body-{n}"))
    }

    /// A fresh path for one run's output file.
    fn scratch(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// Runs `cmd` within [`RUN_TIMEOUT`]; its stdout when it exits 0.
async fn output(mut cmd: Command) -> Result<Vec<u8>, String> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let shown = format!("{:?}", cmd.as_std());
    let child = cmd.spawn().map_err(|e| format!("{shown}: {e}"))?;
    let out = tokio::time::timeout(RUN_TIMEOUT, child.wait_with_output())
        .await
        .map_err(|_| format!("{shown}: still running after {RUN_TIMEOUT:?}"))?
        .map_err(|e| format!("{shown}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{shown}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(out.stdout)
}

/// Splits `STATUS\nBODY` (Node.js) or `BODY\nSTATUS` (curl's `-w`).
fn status_then_body(out: Vec<u8>, status_first: bool) -> Result<(u16, Vec<u8>), String> {
    let at = if status_first {
        out.iter().position(|&b| b == b'\n')
    } else {
        out.iter().rposition(|&b| b == b'\n')
    };
    let at = at.ok_or_else(|| format!("no status in {:?}", String::from_utf8_lossy(&out)))?;
    let (a, b) = (&out[..at], &out[at + 1..]);
    let (status, body) = if status_first { (a, b) } else { (b, a) };
    let status = std::str::from_utf8(status)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| format!("no status in {:?}", String::from_utf8_lossy(&out)))?;
    Ok((status, body.to_vec()))
}

/// Runs `case` with `client` against `base`: the status and body it saw.
async fn run(
    client: Client,
    base: &str,
    case: &Case,
    files: &Files,
    tag: &str,
) -> Result<(u16, Vec<u8>), String> {
    let url = format!("{base}{}", case.target);
    match client {
        Client::CurlH1 | Client::CurlH1NoExpect | Client::CurlH2Tls | Client::CurlH2c => {
            let mut cmd = Command::new("curl");
            cmd.args([
                "-sS",
                "-k",
                "--max-time",
                "15",
                "-o",
                "-",
                "-w",
                "\n%{http_code}",
            ]);
            cmd.arg(match client {
                Client::CurlH1 | Client::CurlH1NoExpect => "--http1.1",
                Client::CurlH2Tls => "--http2",
                _ => "--http2-prior-knowledge",
            });
            if client == Client::CurlH1NoExpect {
                cmd.args(["-H", "Expect:"]);
            }
            cmd.args(["-X", case.method]);
            if let Some(auth) = &case.auth {
                cmd.arg("-H").arg(format!("Authorization: {auth}"));
            }
            if case.upload > 0 {
                cmd.args(["-H", "Content-Type: application/octet-stream"]);
                cmd.arg("--data-binary")
                    .arg(format!("@{}", files.body(case.upload).display()));
            }
            cmd.arg(&url);
            status_then_body(output(cmd).await?, false)
        }
        Client::NodeFetch | Client::NodeHttp2H2c | Client::NodeHttp2Tls => {
            let mut cmd = Command::new("node");
            cmd.arg(files.node_script());
            cmd.arg(if client == Client::NodeFetch {
                "fetch"
            } else {
                "http2"
            });
            cmd.args([
                url.as_str(),
                case.method,
                case.auth.as_deref().unwrap_or(""),
            ]);
            cmd.arg(case.upload.to_string());
            status_then_body(output(cmd).await?, true)
        }
        Client::NghttpH2c | Client::NghttpTls => {
            let har = files.scratch(&format!("{tag}.har"));
            let mut cmd = Command::new("nghttp");
            cmd.args(["-t", "15", "-H"])
                .arg(format!(":method: {}", case.method));
            if let Some(auth) = &case.auth {
                cmd.arg("-H").arg(format!("authorization: {auth}"));
            }
            if case.upload > 0 {
                cmd.arg("-d").arg(files.body(case.upload));
            }
            cmd.arg("-r").arg(&har).arg(&url);
            let body = output(cmd).await?;
            let har: Value =
                serde_json::from_slice(&std::fs::read(&har).map_err(|e| e.to_string())?)
                    .map_err(|e| format!("HAR: {e}"))?;
            let status = har["log"]["entries"][0]["response"]["status"]
                .as_u64()
                .ok_or_else(|| format!("no status in the HAR: {har}"))?;
            Ok((status as u16, body))
        }
    }
}

/// Whether `body` is what `want` asks for; else why not.
fn check(case: &Case, status: u16, body: &[u8]) -> Result<(), String> {
    let text = || String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
    if status != case.status {
        return Err(format!("status {status}, not {}: {}", case.status, text()));
    }
    match case.want {
        Want::Large => {
            if body != large_body() {
                return Err(format!(
                    "a body of {} bytes, not the {LARGE_BODY} sent",
                    body.len()
                ));
            }
        }
        Want::Echo => {
            let json: Value =
                serde_json::from_slice(body).map_err(|e| format!("{e}: {}", text()))?;
            if json["method"] != case.method {
                return Err(format!("not the upstream's echo: {}", text()));
            }
        }
        Want::Error(name) => {
            let json: Value =
                serde_json::from_slice(body).map_err(|e| format!("{e}: {}", text()))?;
            if json["error"] != name || !json["message"].is_string() {
                return Err(format!("not a {name} error body: {}", text()));
            }
        }
    }
    Ok(())
}

/// Every client needed, each with its version line; a missing one fails
/// the test with what to install.
async fn client_versions() -> Vec<String> {
    let mut lines = Vec::new();
    for (bin, arg, package) in [
        ("curl", "--version", "curl"),
        ("node", "--version", "nodejs (18 or later)"),
        ("nghttp", "--version", "nghttp2-client"),
        ("h2load", "--version", "nghttp2-client"),
    ] {
        let out = Command::new(bin).arg(arg).output().await;
        let out = match out {
            Ok(out) if out.status.success() => out,
            Ok(out) => panic!(
                "`{bin} {arg}` failed ({}): reinstall the Debian package {package}",
                out.status
            ),
            Err(e) => panic!(
                "`{bin}` is missing ({e}); the interop matrix needs it: apt-get install -y {}",
                package.split(' ').next().unwrap()
            ),
        };
        let version = String::from_utf8_lossy(&out.stdout);
        let first = version.lines().next().unwrap_or("").trim().to_string();
        if bin == "curl" {
            assert!(
                version.contains("HTTP2"),
                "this curl has no HTTP/2 support: {version}"
            );
        }
        if bin == "node" {
            let major: u32 = first
                .trim_start_matches('v')
                .split('.')
                .next()
                .and_then(|m| m.parse().ok())
                .unwrap_or(0);
            assert!(
                major >= 18,
                "Node.js {first} has no fetch: install Node.js 18 or later"
            );
        }
        lines.push(format!("{bin}: {first}"));
    }
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_clients_get_every_answer_over_every_protocol() {
    let started = Instant::now();
    let versions = client_versions().await;
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let (plain, tls) = tokio::join!(gateway(false, dead), gateway(true, dead));
    let read_only = create_key(
        &plain.cfg.dir.path().join("gateway.toml"),
        "acme",
        "alice",
        "clusters:read",
    )
    .0;
    let read_only_tls = create_key(
        &tls.cfg.dir.path().join("gateway.toml"),
        "acme",
        "alice",
        "clusters:read",
    )
    .0;
    let files = Arc::new(Files::new());
    let gate = Arc::new(Semaphore::new(PARALLEL));

    let mut runs = tokio::task::JoinSet::new();
    for (ci, client) in Client::ALL.into_iter().enumerate() {
        let (w, key) = if client.tls() {
            (&tls, &read_only_tls)
        } else {
            (&plain, &read_only)
        };
        let base = base_url(w, client.tls());
        for (ki, case) in cases(&w.seed, key).into_iter().enumerate() {
            let (files, gate, base) = (files.clone(), gate.clone(), base.clone());
            runs.spawn(async move {
                let _turn = gate.acquire_owned().await.unwrap();
                let tag = format!("{ci}-{ki}");
                let result = match run(client, &base, &case, &files, &tag).await {
                    Ok((status, body)) => check(&case, status, &body),
                    Err(e) => Err(e),
                };
                (ci, ki, result)
            });
        }
    }
    // h2load: many streams at once on a few connections, over both
    // protocols: no stream may end in an error.
    let mut loads = tokio::task::JoinSet::new();
    for tls_on in [false, true] {
        let w = if tls_on { &tls } else { &plain };
        let base = base_url(w, tls_on);
        let key = format!("authorization: Bearer {}", w.seed.key);
        let upload = files.body(UPLOAD);
        let gate = gate.clone();
        loads.spawn(async move {
            let _turn = gate.acquire_owned().await.unwrap();
            let mut results = Vec::new();
            for (what, args) in [
                ("200", vec!["-n", "60", "-c", "2", "-m", "10", "-H", &key]),
                (
                    "401 while uploading",
                    vec![
                        "-n",
                        "12",
                        "-c",
                        "2",
                        "-m",
                        "4",
                        "-H",
                        "authorization: Bearer mpg_notakey",
                        "-d",
                        upload.to_str().unwrap(),
                    ],
                ),
            ] {
                let mut cmd = Command::new("h2load");
                cmd.args(&args)
                    .arg(format!("{base}/api/v1/clusters?organization_id=acme"));
                let n: usize = args[1].parse().unwrap();
                let result = output(cmd).await.and_then(|out| {
                    let out = String::from_utf8_lossy(&out).into_owned();
                    let class = if what == "200" { "2xx" } else { "4xx" };
                    let done = format!("{n} done");
                    let statuses = format!(
                        "status codes: {}",
                        match class {
                            "2xx" => format!("{n} 2xx, 0 3xx, 0 4xx, 0 5xx"),
                            _ => format!("0 2xx, 0 3xx, {n} 4xx, 0 5xx"),
                        }
                    );
                    if out.contains(&done) && out.contains("0 errored") && out.contains(&statuses) {
                        Ok(())
                    } else {
                        Err(out
                            .lines()
                            .filter(|l| {
                                l.starts_with("requests:") || l.starts_with("status codes:")
                            })
                            .collect::<Vec<_>>()
                            .join("; "))
                    }
                });
                results.push((
                    format!("h2load {} {what}", if tls_on { "h2 (TLS)" } else { "h2c" }),
                    result,
                ));
            }
            results
        });
    }

    let kinds = cases(&plain.seed, &read_only);
    let mut grid = vec![vec![None; kinds.len()]; Client::ALL.len()];
    while let Some(done) = runs.join_next().await {
        let (ci, ki, result) = done.unwrap();
        grid[ci][ki] = Some(result);
    }
    let mut extra = Vec::new();
    while let Some(done) = loads.join_next().await {
        extra.extend(done.unwrap());
    }

    // The matrix, and each failure in full.
    let mut table = format!("{:<22}", "");
    for k in &kinds {
        let _ = write!(table, "{:>10}", k.name);
    }
    table.push('\n');
    let mut failures = String::new();
    for (ci, client) in Client::ALL.iter().enumerate() {
        let _ = write!(table, "{:<22}", client.name());
        for (ki, k) in kinds.iter().enumerate() {
            let cell = match &grid[ci][ki] {
                Some(Ok(())) => "ok",
                Some(Err(e)) => {
                    let _ = writeln!(failures, "- {} / {}: {e}", client.name(), k.name);
                    "FAIL"
                }
                None => "?",
            };
            let _ = write!(table, "{cell:>10}");
        }
        table.push('\n');
    }
    for (name, result) in &extra {
        let _ = writeln!(
            table,
            "{name}: {}",
            if result.is_ok() { "ok" } else { "FAIL" }
        );
        if let Err(e) = result {
            let _ = writeln!(failures, "- {name}: {e}");
        }
    }
    let summary = format!(
        "{}\n\n{table}\n(in {:.1?})",
        versions.join("\n"),
        started.elapsed()
    );
    assert!(failures.is_empty(), "{summary}\n\nfailures:\n{failures}");
    println!("{summary}");
}

/// Node.js over HTTP/2: `node never_indexed.js URL AUTH` prints the status,
/// the fields received as never-indexed HPACK literals, and X-RateLimit-Limit.
const NEVER_INDEXED_CLIENT: &str = r#"
const http2 = require('node:http2');
const [url, auth] = process.argv.slice(2);
const u = new URL(url);
const session = http2.connect(u.origin, { rejectUnauthorized: false });
session.on('error', (e) => { console.error('session error:', e); process.exitCode = 1; });
const req = session.request({ ':path': u.pathname + u.search, authorization: auth });
req.on('response', (h) => {
  const sensitive = [...h[http2.sensitiveHeaders]].sort();
  console.log(JSON.stringify({ status: h[':status'], sensitive, limit: h['x-ratelimit-limit'] }));
});
req.on('data', () => {});
req.on('end', () => session.close());
"#;

#[tokio::test]
async fn http2_answers_send_the_fields_that_change_on_every_response_never_indexed() {
    // The request id and the remaining count differ on every response:
    // HPACK gets them as never-indexed literals, which keep them out of the
    // connection's table. Node.js lists such fields in `sensitiveHeaders`.
    let w = world_with(|c| {
        c.set("server.insecure_http", false);
        c.set("server.tls.self_signed", true);
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("never_indexed.js");
    std::fs::write(&script, NEVER_INDEXED_CLIENT).unwrap();
    let url = format!(
        "{}/api/v1/clusters?organization_id=acme",
        base_url(&w, true)
    );
    let mut cmd = Command::new("node");
    cmd.arg(&script)
        .arg(&url)
        .arg(format!("Bearer {}", w.seed.key));
    let out = output(cmd).await.unwrap();
    let got: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(got["status"], 200, "{got}");
    assert_eq!(
        got["sensitive"],
        serde_json::json!(["x-ratelimit-remaining", "x-request-id"]),
        "{got}"
    );
    assert_eq!(got["limit"], "100000", "{got}");
}
