//! The web console (`/console/` on the admin listener) in a real headless
//! Chromium, driven by `tests/console/drive.mjs` (playwright-core): sign-in
//! (a wrong token refused), an organization, a user, a membership and a key
//! made from the page, the key revoked from the page and refused by the
//! gateway (checked with curl), the revocation in the audit trail, a session
//! revoked, a target shown out of rotation, a revoked admin token signing the
//! page out, screenshots of every page at 1280 and 390 px, no CSP violation,
//! and the data plane's counters untouched while the page refreshes.
//! Around it, over plain HTTP: the console's security fields, the Host and
//! cross-site guards, and every admin call the page made refused without
//! the token.
//!
//! Needs Node.js, Chromium and `npm ci --prefix tests/console`; without them
//! the test fails and says what to install. `MPG_CONSOLE_DOCS_IMAGES=1`
//! copies the 1280 px screenshots to `docs/images/console-<page>.png`.
mod common;

use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

const POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
    img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; \
    form-action 'none'; frame-ancestors 'none'";

/// The upstream with no listener, and the open route to it.
const DEAD_UPSTREAM: &str = "billing";
const DEAD_PATH: &str = "/public/billing";

/// The pages the driver photographs.
const PAGES: [&str; 5] = [
    "overview",
    "routes",
    "upstreams",
    "organizations",
    "organization",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The browser, or a panic that says what to install.
fn tools() -> PathBuf {
    let chromium = std::env::var_os("CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    let node = Command::new("node").arg("--version").output();
    let mut missing = Vec::new();
    if !node.is_ok_and(|o| o.status.success()) {
        missing.push("Node.js 18+ (apt-get install nodejs)");
    }
    if !chromium.exists() {
        missing.push("Chromium (apt-get install chromium chromium-driver)");
    }
    if Command::new("curl").arg("--version").output().is_err() {
        missing.push("curl (apt-get install curl)");
    }
    let playwright = root().join("tests/console/node_modules/playwright-core/package.json");
    if !playwright.exists() {
        missing.push("playwright-core (npm ci --prefix tests/console)");
    }
    assert!(
        missing.is_empty(),
        "the console test needs: {}",
        missing.join(", ")
    );
    chromium
}

/// A port nothing listens on.
fn dead_port() -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// `GET path` on the admin listener: its status and headers.
async fn get(admin: std::net::SocketAddr, path: &str) -> (u16, http::HeaderMap) {
    let res = client()
        .get(format!("http://{admin}{path}"))
        .send()
        .await
        .unwrap();
    (res.status().as_u16(), res.headers().clone())
}

#[tokio::test]
async fn the_console_in_a_real_browser() {
    let chromium = tools();

    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    cfg.set("admin.enabled", true);
    cfg.set("admin.listen", "127.0.0.1:0");
    let dead = dead_port();
    cfg.set(
        &format!("upstreams.{DEAD_UPSTREAM}.targets"),
        vec![format!("http://{dead}")],
    );
    cfg.set(&format!("upstreams.{DEAD_UPSTREAM}.max_fails"), 2);
    cfg.set(&format!("upstreams.{DEAD_UPSTREAM}.fail_timeout"), "30s");
    cfg.route(&format!(
        "method = \"GET\"\npath = \"{DEAD_PATH}\"\nauth = \"none\"\nupstream = \"{DEAD_UPSTREAM}\"\nrate_limit = \"none\""
    ));
    let path = cfg.write();
    let made = cli_ok(&path, &["admin-tokens", "create", "--name", "console"]);
    let token = made["token"].as_str().unwrap().to_string();
    let token_id = made["id"].as_str().unwrap().to_string();
    let gw = Gateway::start(&path);
    let admin = gw.admin.expect("admin listener address logged");

    // The console's files carry the policy; the Host and cross-site guards hold.
    for file in ["/console/", "/console/console.js", "/console/console.css"] {
        let (status, headers) = get(admin, file).await;
        assert_eq!(status, 200, "{file}");
        assert_eq!(headers["content-security-policy"], POLICY, "{file}");
        assert_eq!(headers["x-frame-options"], "DENY", "{file}");
        assert_eq!(headers["x-content-type-options"], "nosniff", "{file}");
    }
    let (status, headers) = get(admin, "/console").await;
    assert_eq!(status, 308);
    assert_eq!(headers["location"], "/console/");
    let evil = raw(
        admin,
        b"GET /console/ HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(evil.status, 421, "a rebinding page's Host was answered");
    let reload = client()
        .post(format!("http://{admin}/reload"))
        .header("origin", "http://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(
        reload.status(),
        403,
        "a cross-site POST /reload was accepted"
    );

    // The browser, as an operator.
    let shots = root().join("target/console-screenshots");
    let _ = std::fs::remove_dir_all(&shots);
    std::fs::create_dir_all(&shots).unwrap();
    let mut driver = Command::new("node");
    driver
        .arg(root().join("tests/console/drive.mjs"))
        .current_dir(root().join("tests/console"))
        .env("ADMIN_URL", format!("http://{admin}"))
        .env("ADMIN_TOKEN", &token)
        .env("ADMIN_TOKEN_ID", &token_id)
        .env("GATEWAY_URL", format!("http://{}", gw.addr))
        .env("MPG_BIN", BIN)
        .env("MPG_CONFIG", &path)
        .env("DEAD_PATH", DEAD_PATH)
        .env("DEAD_UPSTREAM", DEAD_UPSTREAM)
        .env("SHOTS", &shots)
        .env("CHROMIUM", &chromium);
    // Off the runtime's thread: the mock upstream keeps answering meanwhile.
    let out = tokio::task::spawn_blocking(move || driver.output().unwrap())
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "the browser driver failed ({}):\n{stdout}\n{stderr}\n--- gateway log (tail) ---\n{}",
        out.status,
        tail(&gw.log_text(), 40)
    );

    for page in PAGES {
        for width in [1280, 390] {
            let shot = shots.join(format!("{page}-{width}.png"));
            let bytes = std::fs::read(&shot).unwrap_or_default();
            assert!(
                bytes.starts_with(b"\x89PNG"),
                "no screenshot {}",
                shot.display()
            );
        }
    }
    if std::env::var_os("MPG_CONSOLE_DOCS_IMAGES").is_some_and(|v| v == "1") {
        copy_to_docs(&shots);
    }

    // Every admin call the page made is refused without the token.
    let calls: Vec<Value> =
        serde_json::from_slice(&std::fs::read(shots.join("calls.json")).unwrap()).unwrap();
    assert!(calls.len() >= 10, "the page made only {calls:?}");
    for call in &calls {
        let method: reqwest::Method = call["method"].as_str().unwrap().parse().unwrap();
        let target = call["path"].as_str().unwrap();
        let mut req = client().request(method.clone(), format!("http://{admin}{target}"));
        if method != reqwest::Method::GET && method != reqwest::Method::DELETE {
            req = req.json(&serde_json::json!({}));
        }
        let status = req.send().await.unwrap().status().as_u16();
        assert_eq!(
            status, 401,
            "{method} {target} without a token answered {status}"
        );
    }
    drop(up);
}

fn copy_to_docs(shots: &Path) {
    let docs = root().join("docs/images");
    std::fs::create_dir_all(&docs).unwrap();
    for page in PAGES {
        std::fs::copy(
            shots.join(format!("{page}-1280.png")),
            docs.join(format!("console-{page}.png")),
        )
        .unwrap();
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
