//! The log as an operator's collector receives it: stderr piped, not a terminal.
mod common;

use common::*;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn ping_route(cfg: &mut TestConfig) {
    cfg.route("method = \"GET\"\npath = \"/public/ping\"\nauth = \"none\"\nupstream = \"clusters\"\nrate_limit = \"none\"");
}

#[tokio::test]
async fn text_logs_to_a_pipe_have_no_colour_codes_and_absent_fields_read_as_a_dash() {
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    cfg.set("log.format", "text");
    cfg.set("log.level", "info");
    ping_route(&mut cfg);
    let path = cfg.write();
    let mut child = Command::new(BIN)
        .arg("run")
        .arg("--config")
        .arg(&path)
        // Colours must be off because stderr is a pipe, whatever the environment says.
        .env_remove("NO_COLOR")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    let addr = loop {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| panic!("no listening line in:\n{}", lines.join("\n")));
        assert!(
            !line.contains("\x1b["),
            "colour codes in a piped log: {line:?}"
        );
        lines.push(line.clone());
        if line.contains(" listening ") {
            let addr = line
                .split("addr=")
                .nth(1)
                .unwrap()
                .split(' ')
                .next()
                .unwrap();
            break addr.parse::<std::net::SocketAddr>().unwrap();
        }
    };
    let c = client();
    let res = c
        .get(format!("http://{addr}/public/ping"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let res = c.get(format!("http://{addr}/nope")).send().await.unwrap();
    assert_eq!(res.status(), 404);
    let mut access = Vec::new();
    while access.len() < 2 {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| panic!("no access lines in:\n{}", lines.join("\n")));
        lines.push(line.clone());
        if line.contains(" access: request ") {
            access.push(line);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let text = lines.join("\n");
    assert!(
        !text.contains("\x1b["),
        "colour codes in a piped log:\n{text}"
    );
    assert!(text.contains(" INFO "), "{text}");
    // An open route: no key, no user, no organization.
    assert!(
        access[0].contains("route=\"/public/ping\""),
        "{}",
        access[0]
    );
    for field in ["key_id=-", "user_id=-", "organization=-"] {
        assert!(access[0].contains(field), "{field} not in {}", access[0]);
    }
    // No route at all: no upstream either.
    for field in ["route=-", "upstream=-", "key_id=-"] {
        assert!(access[1].contains(field), "{field} not in {}", access[1]);
    }
}

/// The access-log objects the gateway has written so far.
fn access_lines(gw: &Gateway) -> Vec<Value> {
    gw.log_text()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["target"] == "access")
        .collect()
}

#[tokio::test]
async fn json_access_lines_have_every_field_with_null_for_what_a_request_has_not_got() {
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    ping_route(&mut cfg);
    let path = cfg.write();
    let seed = seed(&path, "acme", "alice", "owner", "clusters:read");
    let gw = Gateway::start(&path);
    let c = client();
    let keyed = c
        .get(gw.url("/api/v1/clusters?organization_id=acme"))
        .bearer_auth(&seed.key)
        .send()
        .await
        .unwrap();
    assert_eq!(keyed.status(), 200);
    assert_eq!(
        c.get(gw.url("/public/ping")).send().await.unwrap().status(),
        200
    );
    assert_eq!(c.get(gw.url("/nope")).send().await.unwrap().status(), 404);
    let deadline = Instant::now() + Duration::from_secs(10);
    let lines = loop {
        let lines = access_lines(&gw);
        if lines.len() >= 3 || Instant::now() > deadline {
            break lines;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(lines.len(), 3, "{}", gw.log_text());
    let fields = [
        "request_id",
        "method",
        "route",
        "status",
        "latency_us",
        "peer",
        "key_id",
        "user_id",
        "organization",
        "upstream",
        "bytes_in",
        "bytes_out",
    ];
    for line in &lines {
        for f in fields {
            assert!(line.get(f).is_some(), "{f} missing from {line}");
        }
    }
    let (keyed, open, unrouted) = (&lines[0], &lines[1], &lines[2]);
    assert_eq!(keyed["key_id"], seed.key_id.as_str(), "{keyed}");
    assert_eq!(keyed["user_id"], "alice", "{keyed}");
    assert_eq!(keyed["organization"], "acme", "{keyed}");
    for f in ["key_id", "user_id", "organization"] {
        assert_eq!(open[f], Value::Null, "{f} in {open}");
    }
    assert_eq!(open["upstream"], "clusters", "{open}");
    for f in ["route", "key_id", "user_id", "organization", "upstream"] {
        assert_eq!(unrouted[f], Value::Null, "{f} in {unrouted}");
    }
    assert_eq!(unrouted["status"], 404, "{unrouted}");
}
