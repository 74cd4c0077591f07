//! The README's first command: `mpg-gateway demo` serves the seeded API over
//! self-signed TLS, the clusters service behind it creates, lists, gets,
//! updates and deletes clusters (409 while one is changing, 400 naming the
//! field), the lines it prints work as printed (run with bash and curl), and
//! SIGTERM (as Ctrl-C) stops it and removes its temporary store. With
//! `--config FILE` it serves that file's routes and policies instead.
mod common;

use common::*;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `mpg-gateway demo` and what it printed.
struct Demo {
    child: Child,
    lines: Vec<String>,
    /// `https://ADDR/api/v1`
    base: String,
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the demo with `args` (and `TMPDIR` = `tmp`) and reads its welcome.
async fn start_demo(args: &[&str], tmp: &Path) -> Demo {
    let mut child = Command::new(BIN)
        .arg("demo")
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .env("TMPDIR", tmp)
        .env_remove("MPG_GATEWAY_CONFIG")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let lines = tokio::task::spawn_blocking(move || {
        let mut lines = Vec::new();
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            let done = line.starts_with("Press Ctrl-C");
            lines.push(line);
            if done {
                break;
            }
        }
        lines
    });
    let lines = tokio::time::timeout(Duration::from_secs(30), lines)
        .await
        .expect("the demo printed its welcome within 30 s")
        .unwrap();
    let addr = lines
        .first()
        .and_then(|l| l.strip_prefix("mpg-gateway demo is running on "))
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or_else(|| panic!("{lines:?}"))
        .to_string();
    Demo {
        child,
        lines,
        base: format!("https://{addr}/api/v1"),
    }
}

impl Demo {
    /// The token after `Bearer ` on the first printed line holding `marker`.
    fn token(&self, marker: &str) -> String {
        let line = self
            .lines
            .iter()
            .find(|l| l.contains(marker) && l.contains("Bearer "))
            .unwrap_or_else(|| panic!("no line with {marker}: {:?}", self.lines));
        let rest = &line[line.find("Bearer ").unwrap() + "Bearer ".len()..];
        rest[..rest.find('\'').unwrap()].to_string()
    }

    /// The shell text printed under the comment that contains `title`, up
    /// to the next comment.
    fn section(&self, title: &str) -> String {
        let start = self
            .lines
            .iter()
            .position(|l| l.starts_with('#') && l.contains(title))
            .unwrap_or_else(|| panic!("no section {title:?}: {:?}", self.lines));
        self.lines[start..]
            .iter()
            .skip_while(|l| l.starts_with('#'))
            .take_while(|l| !l.starts_with('#') && !l.starts_with("Press Ctrl-C"))
            .filter(|l| !l.trim().is_empty())
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Sends SIGTERM and waits (at most 10 s) for the exit status.
    async fn terminate(&mut self) -> std::process::ExitStatus {
        signal(self.child.id(), "TERM");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the demo did not stop within 10 s of SIGTERM"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// Runs printed shell text with bash, `$ID` set to `id`: stdout and stderr.
fn sh(script: &str, id: &str) -> String {
    let out = Command::new("bash")
        .arg("-c")
        .arg(script)
        .env("ID", id)
        .output()
        .unwrap();
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Whether curl's output holds a status line (`HTTP/2 409`, `HTTP/1.1 409
/// Conflict`, or one counted by `uniq -c`) of `status`.
fn has_status(out: &str, status: u16) -> bool {
    let status = status.to_string();
    out.lines()
        .filter_map(|l| l.find("HTTP/").map(|at| &l[at..]))
        .any(|l| l.split_whitespace().nth(1) == Some(status.as_str()))
}

fn have_curl() -> bool {
    Command::new("curl")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[tokio::test]
async fn the_demo_serves_what_it_prints_and_cleans_up_on_sigterm() {
    let tmp = tempfile::tempdir().unwrap();
    let mut demo = start_demo(&["--busy-for", "2s"], tmp.path()).await;
    let base = demo.base.clone();
    // The first key printed is the read-only one; the create line has the other.
    let read = demo.token("Bearer mpg_");
    let write = demo.token("ID=$(curl");
    let session = demo.token("Bearer mps_");
    assert_ne!(read, write);
    assert!(read.starts_with("mpg_") && write.starts_with("mpg_"));
    let http = http();
    let acme = "organization_id=acme";

    // The clusters resource through the gateway, with the seeded keys.
    let res = http
        .get(format!("{base}/clusters?{acme}"))
        .bearer_auth(&read)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert!(res.headers().contains_key("x-ratelimit-remaining"));
    let body: Value = res.json().await.unwrap();
    let ids: Vec<&str> = body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["cl_demo_primary", "cl_demo_analytics"], "{body}");
    let res = http
        .get(format!("{base}/clusters/cl_demo_primary?{acme}"))
        .bearer_auth(&read)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let body: Value = res.json().await.unwrap();
    assert_eq!(
        (&body["name"], &body["status"]),
        (&Value::from("primary"), &Value::from("running"))
    );
    // The read-only key may read, never write.
    let res = http
        .patch(format!("{base}/clusters/cl_demo_primary?{acme}"))
        .bearer_auth(&read)
        .json(&serde_json::json!({ "plan": "large" }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 403);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["details"]["required_scope"], "clusters:write");
    // Create: 201 and its address; then changing it is a 409 with
    // Retry-After until it has settled.
    let res = http
        .post(format!("{base}/clusters?{acme}"))
        .bearer_auth(&write)
        .json(&serde_json::json!({ "name": "billing", "engine": "postgres-17" }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let location = res.headers()["location"].to_str().unwrap().to_string();
    let created: Value = res.json().await.unwrap();
    assert_eq!(created["status"], "provisioning");
    assert_eq!(created["engine"], "postgres-17");
    assert_eq!(
        location,
        format!("/api/v1/clusters/{}", created["id"].as_str().unwrap())
    );
    let one = format!("{base}/clusters/{}?{acme}", created["id"].as_str().unwrap());
    let res = http
        .patch(&one)
        .bearer_auth(&write)
        .json(&serde_json::json!({ "plan": "large" }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 409);
    assert_eq!(res.headers()["retry-after"], "2");
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["error"], "Conflict");
    // Update a running cluster: 200, and it is "updating" for a while.
    let res = http
        .patch(format!("{base}/clusters/cl_demo_primary?{acme}"))
        .bearer_auth(&write)
        .json(&serde_json::json!({ "name": "main", "plan": "medium" }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let body: Value = res.json().await.unwrap();
    assert_eq!(
        (&body["name"], &body["plan"], &body["status"]),
        (
            &Value::from("main"),
            &Value::from("medium"),
            &Value::from("updating")
        )
    );
    // Bad input: 400 naming the field, in the gateway's error body.
    for (body, field) in [
        (
            serde_json::json!({ "name": "x", "engine": "mysql" }),
            "engine",
        ),
        (
            serde_json::json!({ "name": "x", "replicas": 3 }),
            "replicas",
        ),
        (serde_json::json!({ "engine": "postgres-16" }), "name"),
    ] {
        let res = http
            .post(format!("{base}/clusters?{acme}"))
            .bearer_auth(&write)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 400, "{body}");
        let err: Value = res.json().await.unwrap();
        assert_eq!(err["error"], "BadRequest");
        assert_eq!(err["details"]["field"], field, "{err}");
        assert!(err["message"].as_str().unwrap().starts_with(field), "{err}");
    }
    // Delete: 204, then 404; another organization's view is a 404 too.
    let analytics = format!("{base}/clusters/cl_demo_analytics?{acme}");
    let res = http
        .delete(&analytics)
        .bearer_auth(&write)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 204);
    let res = http
        .get(&analytics)
        .bearer_auth(&read)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 404);
    let res = http
        .get(format!(
            "{base}/clusters/cl_demo_primary?organization_id=other"
        ))
        .bearer_auth(&read)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 404);

    // The printed lines, run as printed, in order, one section at a time; a
    // machine without curl fails here rather than skipping them.
    assert!(have_curl(), "curl runs the printed lines");
    {
        let out = sh(&demo.section("List the clusters"), "");
        assert!(out.contains(r#""id":"cl_demo_primary""#), "{out}");
        let out = sh(&demo.section("another organization is a 404"), "");
        assert!(out.contains(r#""error":"NotFound""#), "{out}");
        assert!(out.contains(r#""reason":"missing""#), "{out}");
        let out = sh(&demo.section("read-only key may not write"), "");
        assert!(out.contains(r#""error":"Forbidden""#), "{out}");
        assert!(out.contains("clusters:write"), "{out}");
        let create = demo.section("Create a cluster");
        let out = sh(&format!("{create}\nprintf '\\nID=%s\\n' \"$ID\""), "");
        assert!(out.contains(r#""status":"provisioning""#), "{out}");
        let id = out
            .lines()
            .find_map(|l| l.strip_prefix("ID="))
            .filter(|id| id.starts_with("cl_"))
            .unwrap_or_else(|| panic!("{out}"))
            .to_string();
        let out = sh(&demo.section("Change it at once"), &id);
        assert!(has_status(&out, 409), "{out}");
        assert!(out.contains("retry-after: 2"), "{out}");
        let out = sh(&demo.section("Bad input"), &id);
        assert!(out.contains(r#""field":"name""#), "{out}");
        // The printed lines wait out the change themselves.
        let out = sh(&demo.section("Delete it"), &id);
        assert!(has_status(&out, 204), "{out}");
        let res = http
            .get(format!("{base}/clusters/{id}?{acme}"))
            .bearer_auth(&write)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 404);
        let out = sh(&demo.section("Manage keys"), &id);
        assert!(out.contains(r#""name":"ci""#), "{out}");
        assert!(out.contains(r#""reason":"revoked""#), "{out}");
        let out = sh(&demo.section("429 with Retry-After"), &id);
        assert!(has_status(&out, 200), "{out}");
        assert!(has_status(&out, 429), "{out}");
        assert!(out.contains("retry-after: "), "{out}");
    }
    // The session token manages keys.
    let res = http
        .get(format!("{base}/api-keys?{acme}"))
        .bearer_auth(&session)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let listed: Value = res.json().await.unwrap();
    assert!(
        listed.to_string().contains("\"demo read-only\""),
        "{listed}"
    );

    // SIGTERM, as a terminal's Ctrl-C or a supervisor would stop it.
    let status = demo.terminate().await;
    assert!(status.success(), "{status:?}");
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert!(left.is_empty(), "the demo left {left:?} behind");
}

#[tokio::test]
async fn the_demo_serves_the_routes_and_policies_of_a_named_file() {
    let tmp = tempfile::tempdir().unwrap();
    // The shipped file with a tight policy, and a store, certificate and
    // clusters target the demo must replace with its own.
    let mut table: toml::Table = SHIPPED_CONFIG.parse().unwrap();
    let policy = &mut table["rate_limit"]["policies"]["default"];
    policy["requests"] = 3.into();
    let store = table["store"].as_table_mut().unwrap();
    store.insert("kind".into(), "postgres".into());
    store.insert("url".into(), "postgres://nobody@127.0.0.1:1/none".into());
    table["upstreams"]["clusters"]["targets"] = vec!["https://127.0.0.1:1".to_string()].into();
    let file = tmp.path().join("mine.toml");
    std::fs::write(&file, toml::to_string(&table).unwrap()).unwrap();
    let run = tempfile::tempdir().unwrap();
    let mut demo = start_demo(&["--config", file.to_str().unwrap()], run.path()).await;
    assert!(
        demo.lines.iter().any(|l| l.contains(&format!(
            "the routes, roles and policies of {}",
            file.display()
        ))),
        "{:?}",
        demo.lines
    );
    let flood = demo.section("GET /clusters allows 3 requests per 1m");
    assert!(flood.contains("seq 14"), "{flood}");
    let key = demo.token("Bearer mpg_");
    let http = http();
    let url = format!("{}/clusters?organization_id=acme", demo.base);
    for i in 0..3 {
        let res = http.get(&url).bearer_auth(&key).send().await.unwrap();
        assert_eq!(res.status(), 200, "request {i}");
    }
    let res = http.get(&url).bearer_auth(&key).send().await.unwrap();
    assert_eq!(res.status(), 429);
    assert!(res.headers().contains_key("retry-after"));
    assert_eq!(res.headers()["x-ratelimit-limit"], "3");
    assert!(demo.terminate().await.success());
    let left: Vec<_> = std::fs::read_dir(run.path()).unwrap().collect();
    assert!(left.is_empty(), "the demo left {left:?} behind");
}

#[test]
fn a_named_file_that_is_missing_or_invalid_stops_the_demo_with_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[[routes]]\nmethod = \"GET\"\npath = \"/x\"\nauth = \"none\"\nupstream = \"nowhere\"\n",
    )
    .unwrap();
    let missing = tmp.path().join("missing.toml");
    for (file, want) in [
        (&missing, "cannot read the file"),
        (&bad, "routes[0].upstream"),
    ] {
        // By the flag, and by the environment variable.
        for by_env in [false, true] {
            let mut cmd = Command::new(BIN);
            if by_env {
                cmd.env("MPG_GATEWAY_CONFIG", file);
            } else {
                cmd.env_remove("MPG_GATEWAY_CONFIG")
                    .arg("--config")
                    .arg(file);
            }
            let out = cmd
                .args(["demo", "--listen", "127.0.0.1:0"])
                .env("TMPDIR", tmp.path())
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{stderr}");
            assert!(stderr.contains(&file.display().to_string()), "{stderr}");
            assert!(stderr.contains(want), "{stderr}");
            assert!(out.stdout.is_empty());
        }
    }
    let out = Command::new(BIN)
        .args(["demo", "--busy-for", "2h"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--busy-for"));
}
