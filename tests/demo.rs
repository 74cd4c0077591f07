//! The README's first command: `mpg-gateway demo` serves the seeded API over
//! self-signed TLS, the lines it prints work as printed, and SIGTERM (as
//! Ctrl-C) stops it and removes its temporary store.
mod common;

use common::*;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The text between `after` and the next `'` in `line`.
fn quoted_after<'a>(line: &'a str, after: &str) -> Option<&'a str> {
    let rest = &line[line.find(after)? + after.len()..];
    Some(&rest[..rest.find('\'')?])
}

#[tokio::test]
async fn the_demo_serves_what_it_prints_and_cleans_up_on_sigterm() {
    let tmp = tempfile::tempdir().unwrap();
    let mut child = Command::new(BIN)
        .args(["demo", "--listen", "127.0.0.1:0"])
        .env("TMPDIR", tmp.path())
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
    let addr = lines[0]
        .strip_prefix("mpg-gateway demo is running on ")
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or_else(|| panic!("{lines:?}"));
    let base = format!("https://{addr}/api/v1");
    let key_line = lines
        .iter()
        .find(|l| l.contains("clusters?organization_id=acme") && l.contains("Bearer mpg_"))
        .unwrap_or_else(|| panic!("{lines:?}"));
    let key = quoted_after(key_line, "Bearer ").unwrap();
    let session_line = lines
        .iter()
        .find(|l| l.contains("Bearer mps_"))
        .unwrap_or_else(|| panic!("{lines:?}"));
    let session = quoted_after(session_line, "Bearer ").unwrap();
    let http = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();

    let res = http
        .get(format!("{base}/clusters?organization_id=acme"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert!(res.headers().contains_key("x-ratelimit-remaining"));
    let body: serde_json::Value = res.json().await.unwrap();
    assert!(body.is_object() || body.is_array(), "{body}");
    let res = http
        .get(format!("{base}/clusters?organization_id=other"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 404);
    let res = http
        .get(format!("{base}/clusters?organization_id=acme"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401);
    let res = http
        .get(format!("{base}/api-keys?organization_id=acme"))
        .bearer_auth(session)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let listed: serde_json::Value = res.json().await.unwrap();
    assert!(listed.to_string().contains("\"acme\""), "{listed}");

    // SIGTERM, as a terminal's Ctrl-C or a supervisor would stop it.
    signal(child.id(), "TERM");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the demo did not stop within 10 s of SIGTERM");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status:?}");
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert!(left.is_empty(), "the demo left {left:?} behind");
}
