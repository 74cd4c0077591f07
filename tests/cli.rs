//! The command line: exit codes, JSON on stdout, messages naming what is wrong.
mod common;

use common::*;
use std::process::Command;

fn config() -> TestConfig {
    TestConfig::new("127.0.0.1:9".parse().unwrap())
}

#[test]
fn check_config_accepts_a_good_file_and_lists_every_problem_of_a_bad_one() {
    let cfg = config();
    let path = cfg.write();
    let (code, _, err) = cli(&path, &["check-config"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("OK"), "{err}");

    let bad = cfg.dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[server]\nlisten = \"nowhere\"\n[server.tls]\ncert = \"missing.pem\"\nkey = \"missing.pem\"\n[store]\nnegative_cache_capacity = 0\n[upstreams.x]\ntargets = []\n[[routes]]\nmethod = \"GET\"\npath = \"/a\"\nauth = \"api_key\"\nupstream = \"y\"\n",
    )
    .unwrap();
    let (code, _, err) = cli(&bad, &["check-config"]);
    assert_eq!(code, 2);
    for path in [
        "server.listen",
        "server.tls.cert",
        "server.tls.key",
        "store.negative_cache_capacity",
        "upstreams.x.targets",
        "routes[0].upstream",
    ] {
        assert!(err.contains(path), "{path} not named in:\n{err}");
    }
    let (code, _, err) = cli(&cfg.dir.path().join("absent.toml"), &["check-config"]);
    assert_eq!(code, 2);
    assert!(err.contains("absent.toml"), "{err}");
}

#[test]
fn check_config_refuses_a_key_that_does_not_match_its_certificate() {
    let mut cfg = config();
    let (cert, _) = mpg_gateway::tls::self_signed_pem().unwrap();
    let (_, other_key) = mpg_gateway::tls::self_signed_pem().unwrap();
    let c = cfg.dir.path().join("cert.pem");
    let k = cfg.dir.path().join("key.pem");
    std::fs::write(&c, cert).unwrap();
    std::fs::write(&k, other_key).unwrap();
    cfg.set("server.insecure_http", false);
    cfg.set("server.tls.cert", c.to_str().unwrap());
    cfg.set("server.tls.key", k.to_str().unwrap());
    let (code, _, err) = cli(&cfg.write(), &["check-config"]);
    assert_eq!(code, 2);
    assert!(err.contains("does not match"), "{err}");
    // Reported as the file's other problems are: a header, then the path.
    assert!(err.contains(": 1 problem(s)\n  server.tls: "), "{err}");
}

/// A config on SQLite, or on a PostgreSQL database of its own (kept alive by the `PgDb`).
fn config_on(pg: bool) -> (TestConfig, Option<common::scale::PgDb>) {
    let mut cfg = config();
    if !pg {
        return (cfg, None);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let db = rt.block_on(common::scale::PgDb::create());
    cfg.postgres(&db.url);
    (cfg, Some(db))
}

#[test]
fn admin_commands_print_json_and_refuse_bad_input_with_exit_2() {
    admin_commands(false);
}

#[test]
fn admin_commands_work_the_same_on_postgres() {
    admin_commands(true);
}

fn admin_commands(pg: bool) {
    let (cfg, _db) = config_on(pg);
    let path = cfg.write();
    let org = cli_ok(&path, &["orgs", "create", "--id", "acme", "--name", "Acme"]);
    assert_eq!(org["id"], "acme");
    let (code, _, err) = cli(&path, &["orgs", "create", "--id", "acme"]);
    assert_eq!(code, 2, "duplicate org: {err}");
    cli_ok(
        &path,
        &[
            "users",
            "create",
            "--id",
            "alice",
            "--email",
            "a@example.com",
        ],
    );
    let (code, _, err) = cli(
        &path,
        &[
            "members", "add", "--org", "acme", "--user", "alice", "--role", "emperor",
        ],
    );
    assert_eq!(code, 2);
    assert!(err.contains("emperor") && err.contains("viewer"), "{err}");
    let (code, _, _) = cli(
        &path,
        &[
            "members", "add", "--org", "nope", "--user", "alice", "--role", "owner",
        ],
    );
    assert_eq!(code, 2);
    cli_ok(
        &path,
        &[
            "members", "add", "--org", "acme", "--user", "alice", "--role", "member",
        ],
    );

    let session = cli_ok(
        &path,
        &["sessions", "create", "--user", "alice", "--ttl", "1h"],
    );
    assert!(session["token"].as_str().unwrap().starts_with("mps_"));
    assert_eq!(session["user_id"], "alice");
    assert!(session["expires_at"].as_str().unwrap().ends_with('Z'));
    let (code, _, err) = cli(
        &path,
        &["sessions", "create", "--user", "alice", "--ttl", "soon"],
    );
    assert_eq!(code, 2);
    assert!(err.contains("--ttl"), "{err}");
    // An organization that never was: exit 2, worded as the other commands word it.
    let (code, _, err) = cli(&path, &["audit", "list", "--org", "nope"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no organization with id \"nope\""), "{err}");

    let key = cli_ok(
        &path,
        &[
            "keys",
            "create",
            "--org",
            "acme",
            "--user",
            "alice",
            "--name",
            "ci",
            "--scopes",
            "clusters:read,clusters:write",
            "--expires-in",
            "30d",
        ],
    );
    let id = key["id"].as_str().unwrap();
    assert!(key["key"].as_str().unwrap().starts_with("mpg_"));
    assert_eq!(
        key["scopes"],
        serde_json::json!(["clusters:read", "clusters:write"])
    );
    let (code, _, err) = cli(
        &path,
        &[
            "keys",
            "create",
            "--org",
            "acme",
            "--user",
            "alice",
            "--name",
            "x",
            "--scopes",
            "clusters:nuke",
        ],
    );
    assert_eq!(code, 2);
    assert!(err.contains("clusters:nuke"), "{err}");

    let got = cli_ok(&path, &["keys", "get", id]);
    assert!(
        got.get("key").is_none(),
        "the secret must be shown only once"
    );
    let list = cli_ok(&path, &["keys", "list", "--org", "acme"]);
    assert_eq!(list["data"].as_array().unwrap().len(), 1);
    assert_eq!(cli_ok(&path, &["keys", "revoke", id])["status"], "revoked");
    cli_ok(&path, &["keys", "delete", id]);
    let (code, _, _) = cli(&path, &["keys", "get", id]);
    assert_eq!(code, 2);
}

#[test]
fn migrate_is_idempotent_and_usage_errors_exit_2() {
    for pg in [false, true] {
        let (cfg, _db) = config_on(pg);
        let path = cfg.write();
        cli_ok(&path, &["migrate"]);
        cli_ok(&path, &["migrate"]);
    }
    let out = Command::new(BIN)
        .args(["keys", "create", "--org"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = Command::new(BIN).arg("frobnicate").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn run_refuses_an_invalid_config_with_exit_2() {
    let cfg = config();
    let bad = cfg.dir.path().join("bad.toml");
    std::fs::write(&bad, "[server]\nlisten = 1\n").unwrap();
    let out = Command::new(BIN)
        .args(["run", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("server.listen"));
}

#[test]
fn check_config_refuses_connection_and_header_limits_too_large_to_serve() {
    // Each passed check-config and then panicked at start (tokio's semaphore
    // limit, or an overflow of the HTTP/2 header-list limit).
    for (key, value) in [
        ("server.limits.max_connections", i64::MAX),
        ("server.limits.max_header_bytes", i64::MAX),
        ("upstreams.clusters.max_connections_per_target", i64::MAX),
    ] {
        let mut cfg = config();
        cfg.set(key, value);
        let path = cfg.write();
        let (code, _, err) = cli(&path, &["check-config"]);
        assert_eq!(code, 2, "{key} = {value} was accepted: {err}");
        assert!(err.contains(key), "{key} not named in:\n{err}");
        let out = Command::new(BIN)
            .args(["run", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{key}: run did not refuse it");
        assert!(
            !String::from_utf8_lossy(&out.stderr).contains("panicked"),
            "{key}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// check-config's problem lines (after the `FILE: N problem(s)` header).
fn problem_lines(err: &str) -> Vec<&str> {
    err.lines()
        .skip_while(|l| !l.contains("problem(s)"))
        .skip(1)
        .filter(|l| l.starts_with("  ") && !l.starts_with("    "))
        .collect()
}

#[test]
fn check_config_names_a_broken_upstream_or_policy_once_not_per_route() {
    // A typo in [upstreams.clusters], which several routes use.
    let mut cfg = config();
    cfg.set("upstreams.clusters.conect_timeout", "2s");
    let (code, _, err) = cli(&cfg.write(), &["check-config"]);
    assert_eq!(code, 2, "{err}");
    let lines = problem_lines(&err);
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].starts_with("  upstreams.clusters.conect_timeout: unknown field"),
        "{err}"
    );
    assert!(err.contains(": 1 problem(s)"), "{err}");

    // A bad field in the policy every route uses.
    let mut cfg = config();
    cfg.set("rate_limit.policies.default.requests", "100");
    let (code, _, err) = cli(&cfg.write(), &["check-config"]);
    assert_eq!(code, 2, "{err}");
    let lines = problem_lines(&err);
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].starts_with("  rate_limit.policies.default.requests: invalid type"),
        "{err}"
    );
}

#[test]
fn check_config_shows_a_syntax_error_with_its_line_and_a_caret() {
    let cfg = config();
    let bad = cfg.dir.path().join("bad.toml");
    std::fs::write(&bad, "[server]\nlisten = \"127.0.0.1:0\"\n[upstreams\n").unwrap();
    let (code, _, err) = cli(&bad, &["check-config"]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(problem_lines(&err).len(), 1, "{err}");
    assert!(err.contains("line 3, column 11"), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    let source = lines
        .iter()
        .position(|l| l.ends_with("3 | [upstreams"))
        .unwrap_or_else(|| panic!("no source line in:\n{err}"));
    // The caret sits under the column the parser stopped at (column 11).
    let column_1 = lines[source].find('[').unwrap();
    assert_eq!(lines[source + 1].find('^'), Some(column_1 + 10), "{err}");
}

#[test]
fn check_config_refuses_key_service_routes_that_skip_the_keys_organization() {
    // `POST /api-keys/{id}/revoke` without `organization = "key:id"` (and
    // without a scope, which then needs no organization) let any session
    // revoke any organization's key.
    let mut cfg = config();
    let routes = cfg.table["routes"].as_array_mut().unwrap();
    let revoke = routes
        .iter_mut()
        .find(|r| r["path"].as_str() == Some("/api/v1/api-keys/{id}/revoke"))
        .unwrap()
        .as_table_mut()
        .unwrap();
    revoke.remove("scope");
    revoke.insert("organization".into(), "none".into());
    let (code, _, err) = cli(&cfg.write(), &["check-config"]);
    assert_eq!(code, 2, "accepted: {err}");
    assert!(
        err.contains(".organization") && err.contains("key:id"),
        "{err}"
    );
}

#[test]
fn migrate_never_prints_the_store_password() {
    let (mut cfg, db) = config_on(true);
    let db = db.unwrap();
    // Trust authentication on the test server ignores the password.
    cfg.postgres(&format!("{}?password=hunter2", db.url));
    let out = cli_ok(&cfg.write(), &["migrate"]);
    let shown = out["store"].as_str().unwrap();
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(shown.contains(&db.name), "{shown}");
}

#[test]
fn a_store_url_parameter_the_driver_would_ignore_is_refused_by_name_never_logged() {
    let (mut cfg, db) = config_on(true);
    let db = db.unwrap();
    // The PostgreSQL driver ignores these, and logs each with its value.
    cfg.postgres(&format!(
        "{}?sslpassword=HUNTER2sslpass&auth_token=HUNTER2token",
        db.url
    ));
    let path = cfg.write();
    for args in [
        &["check-config"][..],
        &["migrate"],
        &["orgs", "list"],
        &["run"],
    ] {
        // Bounded: a `run` that accepted the file would serve until stopped.
        let out = common::backends::run_bounded(
            std::process::Command::new(BIN)
                .arg("--config")
                .arg(&path)
                .args(args),
            std::time::Duration::from_secs(20),
        );
        let (code, err) = (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).to_string(),
        );
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(
            err.contains("store.url: unknown connect parameter \"sslpassword\""),
            "{args:?}: {err}"
        );
        assert!(err.contains("\"auth_token\""), "{args:?}: {err}");
        assert!(!err.contains("HUNTER2"), "{args:?}: {err}");
    }
}

#[test]
fn lifetimes_past_the_year_9999_are_refused_not_printed_as_no_expiry() {
    // RFC 3339 stops at 9999-12-31: such an expiry came out as `"expires_at": ""`
    // for a session and `null` (never expires) for a key that does.
    let cfg = config();
    let path = cfg.write();
    seed(&path, "acme", "alice", "owner", "clusters:read");
    let (code, out, err) = cli(
        &path,
        &["sessions", "create", "--user", "alice", "--ttl", "4000000d"],
    );
    assert_eq!(code, 2, "{out}");
    assert!(err.contains("--ttl"), "{err}");
    let (code, out, err) = cli(
        &path,
        &[
            "keys",
            "create",
            "--org",
            "acme",
            "--user",
            "alice",
            "--name",
            "far",
            "--scopes",
            "clusters:read",
            "--expires-in",
            "4000000d",
        ],
    );
    assert_eq!(code, 2, "{out}");
    assert!(err.contains("--expires-in"), "{err}");
    // Long but writable lifetimes still work.
    let key = cli_ok(
        &path,
        &[
            "keys",
            "create",
            "--org",
            "acme",
            "--user",
            "alice",
            "--name",
            "long",
            "--scopes",
            "clusters:read",
            "--expires-in",
            "36500d",
        ],
    );
    assert!(key["expires_at"].as_str().unwrap().ends_with('Z'), "{key}");
}

#[test]
fn admin_commands_do_not_need_the_servers_tls_files_but_check_config_and_run_do() {
    // The shipped config names config/tls/*.pem; on a machine without them
    // (an operator's laptop, a CI job) `orgs create` failed on server.tls.cert.
    let mut cfg = config();
    cfg.set("server.insecure_http", false);
    let absent = cfg.dir.path().join("absent");
    cfg.set("server.tls.cert", absent.join("cert.pem").to_str().unwrap());
    cfg.set("server.tls.key", absent.join("key.pem").to_str().unwrap());
    let path = cfg.write();
    cli_ok(&path, &["migrate"]);
    assert_eq!(
        cli_ok(&path, &["orgs", "create", "--id", "acme"])["id"],
        "acme"
    );
    assert_eq!(cli_ok(&path, &["orgs", "list"])["data"][0]["id"], "acme");
    let (code, _, err) = cli(&path, &["check-config"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("server.tls.cert") && err.contains("server.tls.key"),
        "{err}"
    );
    let out = Command::new(BIN)
        .args(["run", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("server.tls.cert"));
    // Whatever else is wrong is still refused.
    cfg.set("store.query_timeout", "0s");
    let (code, _, err) = cli(&cfg.write(), &["orgs", "list"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("store.query_timeout"), "{err}");
}

/// An address where nothing listens (a port bound, then released).
fn closed_port() -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

#[test]
fn a_missing_database_a_refused_login_and_a_refused_connection_are_named_as_such() {
    use common::scale::{host_port, pg_admin_url, with_database};
    let pg = host_port(&pg_admin_url());
    for (url, cause) in [
        (
            with_database(&pg_admin_url(), "mpg_no_such_database"),
            "database \"mpg_no_such_database\" does not exist",
        ),
        // Trust authentication here: a role that does not exist is refused.
        (
            format!("postgres://nosuchuser:hunter2@{pg}/test"),
            "PostgreSQL refused the login: role \"nosuchuser\" does not exist",
        ),
        (
            format!("postgres://postgres:hunter2@{}/test", closed_port()),
            "connection refused",
        ),
    ] {
        let mut cfg = config();
        cfg.postgres(&url);
        let path = cfg.write();
        let (code, _, err) = cli(&path, &["orgs", "create", "--id", "acme"]);
        assert_eq!(code, 1, "{url}: {err}");
        assert!(err.contains(cause), "{url}: {err}");
        assert!(
            !err.contains("unavailable")
                && !err.contains("unreachable")
                && !err.contains("timed out"),
            "{url}: {err}"
        );
        assert!(!err.contains("hunter2"), "{err}");
        // The same words when the gateway starts (and does not wait for a store
        // that refuses connections).
        cfg.set("store.wait_at_start", false);
        let path = cfg.write();
        let out = Command::new(BIN)
            .args(["run", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(cause), "{url}: {stderr}");
        assert!(!stderr.contains("hunter2"), "{stderr}");
    }
}

#[test]
fn a_redis_that_refuses_connections_is_logged_as_refused_not_as_a_timeout() {
    let mut cfg = config();
    cfg.redis(&format!("redis://{}", closed_port()), "mpgtest:refused:");
    let gw = Gateway::start(&cfg.write());
    let log = gw.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("rate-limit backend") && l.contains("failing"))
        .unwrap_or_else(|| panic!("no limiter failure logged:\n{log}"));
    assert!(line.to_lowercase().contains("connection refused"), "{line}");
    assert!(!line.contains("timed out"), "{line}");
}

#[test]
fn keys_rotate_prints_the_new_key_and_marks_the_old_one() {
    for pg in [false, true] {
        let (cfg, _db) = config_on(pg);
        let path = cfg.write();
        let s = seed(&path, "acme", "alice", "owner", "clusters:read");
        let before = std::time::SystemTime::now();
        let new = cli_ok(&path, &["keys", "rotate", &s.key_id, "--grace", "1h"]);
        let after = std::time::SystemTime::now();
        let new_id = new["id"].as_str().unwrap();
        assert_ne!(new_id, s.key_id);
        assert!(new["key"].as_str().unwrap().starts_with("mpg_"), "{new}");
        assert_eq!(new["scopes"], serde_json::json!(["clusters:read"]));
        assert_eq!(new["status"], "active");
        assert!(new["replaced_by"].is_null());
        let old = cli_ok(&path, &["keys", "get", &s.key_id]);
        assert_eq!(old["replaced_by"], new_id);
        assert_eq!(old["status"], "active", "within the grace period");
        // The old key ends one hour after the rotation, to the second.
        let expires = time::OffsetDateTime::parse(
            old["expires_at"].as_str().unwrap(),
            &time::format_description::well_known::Rfc3339,
        )
        .unwrap();
        let hour = time::Duration::hours(1);
        let second = time::Duration::seconds(1);
        let (from, to) = (
            time::OffsetDateTime::from(before),
            time::OffsetDateTime::from(after),
        );
        assert!(
            expires >= from + hour - second && expires <= to + hour + second,
            "{old}: expires_at is not the rotation plus 1 h"
        );
        // A key is rotated once; the refusal says why.
        let (code, _, err) = cli(&path, &["keys", "rotate", &s.key_id]);
        assert_eq!(code, 2);
        assert!(err.contains("already rotated"), "{err}");
        assert!(!err.contains("already exists"), "{err}");
        // Without --grace the old key ends at once.
        cli_ok(&path, &["keys", "rotate", new_id]);
        assert_eq!(cli_ok(&path, &["keys", "get", new_id])["status"], "expired");
        for bad in ["8d", "soon"] {
            let (code, _, err) = cli(&path, &["keys", "rotate", new_id, "--grace", bad]);
            assert_eq!(code, 2, "{bad}");
            assert!(err.contains("--grace"), "{bad}: {err}");
        }
    }
}

#[test]
fn admin_commands_do_not_need_the_upstreams_signing_keys_but_check_config_does() {
    let mut cfg = config();
    let unset = format!("MPG_TEST_UNSET_SIGNING_KEY_{}", std::process::id());
    std::env::remove_var(&unset);
    cfg.set("upstreams.clusters.sign_identity_key_env", unset.as_str());
    let path = cfg.write();
    // The store's commands act without the key an operator's machine lacks.
    cli_ok(&path, &["orgs", "create", "--id", "acme"]);
    let listed = cli_ok(&path, &["orgs", "list"]);
    assert_eq!(listed["data"][0]["id"], "acme", "{listed}");
    cli_ok(&path, &["audit", "list", "--org", "acme"]);
    // Serving needs it, and check-config says so.
    let (code, _, err) = cli(&path, &["check-config"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("upstreams.clusters.sign_identity_key_env"),
        "{err}"
    );
    assert!(err.contains(&unset), "{err}");
}

/// (method, path) of every route in a shipped configuration file.
fn shipped_routes(file: &str) -> std::collections::BTreeSet<(String, String)> {
    let text =
        std::fs::read_to_string(format!("{}/config/{file}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let table: toml::Table = text.parse().unwrap();
    table["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let s = |k: &str| r[k].as_str().unwrap().to_string();
            (s("method"), s("path"))
        })
        .collect()
}

#[test]
fn every_shipped_config_routes_every_operation_of_the_openapi_document() {
    // The operations of docs/openapi.yaml: `  /path:` then `    verb:` lines.
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.yaml")).unwrap();
    let mut operations = Vec::new();
    let mut path = None;
    for line in doc.lines() {
        if let Some(p) = line.strip_prefix("  /").and_then(|p| p.strip_suffix(':')) {
            path = Some(format!("/api/v1/{p}"));
        } else if line.starts_with("components:") {
            break;
        } else if let (Some(p), Some(verb)) = (
            &path,
            line.strip_prefix("    ").and_then(|l| l.strip_suffix(':')),
        ) {
            if ["get", "post", "put", "patch", "delete"].contains(&verb) {
                operations.push((verb.to_uppercase(), p.clone()));
            }
        }
    }
    assert!(operations.len() >= 7, "{operations:?}");
    let reference = shipped_routes("gateway.toml");
    for (method, path) in &operations {
        assert!(
            reference.contains(&(method.clone(), path.clone())),
            "config/gateway.toml lacks {method} {path}"
        );
    }
    assert_eq!(
        shipped_routes("production.toml"),
        reference,
        "config/production.toml"
    );
}

#[test]
fn a_port_in_use_is_named_with_its_setting_once() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let mut cfg = config();
    cfg.set("server.listen", addr.to_string());
    cfg.set("log.format", "text");
    let out = common::backends::run_bounded(
        Command::new(BIN).args(["run", "--config"]).arg(cfg.write()),
        std::time::Duration::from_secs(20),
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let said = format!("cannot listen on {addr} (server.listen)");
    assert_eq!(err.matches(&said).count(), 1, "{err}");
}

#[test]
fn check_config_names_each_bad_tracing_key() {
    let mut cfg = config();
    cfg.set("tracing.otlp_endpoint", "collector:4318");
    cfg.set("tracing.sample_ratio", 2.0);
    let (code, _, err) = cli(&cfg.write(), &["check-config"]);
    assert_eq!(code, 2, "{err}");
    let lines = problem_lines(&err);
    assert_eq!(lines.len(), 2, "{err}");
    assert!(lines[0].starts_with("  tracing.otlp_endpoint: "), "{err}");
    assert!(lines[0].contains("http://"), "{err}");
    assert!(
        lines[1].starts_with("  tracing.sample_ratio: 2 is outside 0 to 1"),
        "{err}"
    );

    let mut cfg = config();
    cfg.set("tracing.protocol", "zipkin");
    let (code, _, err) = cli(&cfg.write(), &["check-config"]);
    assert_eq!(code, 2, "{err}");
    let lines = problem_lines(&err);
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].starts_with("  tracing.protocol: "), "{err}");
    assert!(lines[0].contains("grpc"), "{err}");
}

/// `keys update ID ARGS…`, which must succeed; returns the printed record.
fn update_ok(path: &std::path::Path, id: &str, args: &[&str]) -> serde_json::Value {
    let all: Vec<&str> = ["keys", "update", id].iter().chain(args).copied().collect();
    cli_ok(path, &all)
}

/// `keys get ID`'s field `field`.
fn stored(path: &std::path::Path, id: &str, field: &str) -> serde_json::Value {
    cli_ok(path, &["keys", "get", id])[field].clone()
}

/// The `api_key.updated` events of key `id` in org `acme`, newest first.
fn updates(path: &std::path::Path, id: &str) -> Vec<serde_json::Value> {
    let trail = cli_ok(path, &["audit", "list", "--org", "acme"]);
    trail["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "api_key.updated" && e["key_id"] == id)
        .cloned()
        .collect()
}

#[test]
fn keys_update_sets_each_flag_and_audits_the_names_of_the_fields_set() {
    use serde_json::json;
    for pg in [false, true] {
        let (cfg, _db) = config_on(pg);
        let path = cfg.write();
        let id = seed(&path, "acme", "alice", "owner", "clusters:read").key_id;
        let id = id.as_str();
        // (flags, field, what `keys get` then shows)
        let steps: &[(&[&str], &str, serde_json::Value)] = &[
            (&["--name", "renamed"], "name", json!("renamed")),
            (&["--enabled", "false"], "enabled", json!(false)),
            (&["--enabled", "true"], "enabled", json!(true)),
            (
                &["--ip-allow", "203.0.113.0/24, 2001:db8::/32,198.51.100.7"],
                "ip_allow",
                json!(["203.0.113.0/24", "2001:db8::/32", "198.51.100.7/32"]),
            ),
            (&["--ip-allow", "none"], "ip_allow", json!(null)),
            (
                &["--meta", r#"{"plan":"pro","seats":5}"#],
                "meta",
                json!({"plan": "pro", "seats": 5}),
            ),
            (&["--meta", "null"], "meta", json!(null)),
            (
                &["--meta", r#"{"plan":"free"}"#],
                "meta",
                json!({"plan": "free"}),
            ),
            (&["--meta", "none"], "meta", json!(null)),
            (
                &["--credits", "100"],
                "credits",
                json!({"remaining": 100, "refill": null}),
            ),
            // A refill alone keeps the count; a count alone keeps the refill.
            (
                &["--refill", "1000/1d"],
                "credits",
                json!({"remaining": 100, "refill": {"amount": 1000, "interval": "1d"}}),
            ),
            (
                &["--credits", "0"],
                "credits",
                json!({"remaining": 0, "refill": {"amount": 1000, "interval": "1d"}}),
            ),
            (
                &["--refill", "none"],
                "credits",
                json!({"remaining": 0, "refill": null}),
            ),
            (&["--credits", "none"], "credits", json!(null)),
            // A refill on a key without credits starts at its amount.
            (
                &["--refill", "50/1h"],
                "credits",
                json!({"remaining": 50, "refill": {"amount": 50, "interval": "1h"}}),
            ),
            (
                &["--rate-limit", "10/1m"],
                "rate_limit",
                json!({"requests": 10, "per": "1m"}),
            ),
            (&["--rate-limit", "none"], "rate_limit", json!(null)),
        ];
        for (args, field, shown) in steps {
            let printed = update_ok(&path, id, args);
            assert_eq!(&printed[field], shown, "{args:?} printed {printed}");
            assert_eq!(&stored(&path, id, field), shown, "{args:?}");
            assert!(printed.get("key").is_none(), "{printed}");
            let newest = &updates(&path, id)[0];
            assert_eq!(newest["fields"], json!([field]), "{args:?}: {newest}");
            assert_eq!(newest["actor"], "cli", "{newest}");
        }
        assert_eq!(updates(&path, id).len(), steps.len());

        // Several flags at once: one event naming each field, in the API's order.
        let printed = update_ok(
            &path,
            id,
            &["--credits", "7", "--enabled", "false", "--name", "both"],
        );
        assert_eq!(
            (
                &printed["name"],
                &printed["enabled"],
                &printed["credits"]["remaining"]
            ),
            (&json!("both"), &json!(false), &json!(7)),
            "{printed}"
        );
        let newest = &updates(&path, id)[0];
        assert_eq!(
            newest["fields"],
            json!(["name", "enabled", "credits"]),
            "{newest}"
        );
        // Nothing but what was named changed.
        let key = cli_ok(&path, &["keys", "get", id]);
        assert_eq!(key["scopes"], json!(["clusters:read"]));
        assert_eq!(key["status"], "active");
        assert_eq!(key["rate_limit"], json!(null));
    }
}

#[test]
fn keys_update_refuses_bad_values_by_flag_and_changes_nothing() {
    let cfg = config();
    let path = cfg.write();
    let id = seed(&path, "acme", "alice", "owner", "clusters:read").key_id;
    let before = cli_ok(&path, &["keys", "get", &id]);
    let big_meta = format!(r#"{{"x":"{}"}}"#, "a".repeat(4096));
    let long_name = "n".repeat(101);
    // (flags, the flag the message names, words it must hold)
    let bad: &[(&[&str], &str, &str)] = &[
        (&[], "--enabled", "at least one"),
        (&["--name", " "], "--name", "empty"),
        (&["--name", &long_name], "--name", "100"),
        (&["--enabled", "yes"], "--enabled", "true"),
        (&["--ip-allow", "10.0.0.1/8"], "--ip-allow", "10.0.0.0/8"),
        (&["--ip-allow", "nowhere"], "--ip-allow", "CIDR"),
        (&["--ip-allow", ","], "--ip-allow", "at least one"),
        (&["--meta", "[1]"], "--meta", "object"),
        (&["--meta", "{"], "--meta", "JSON"),
        (&["--meta", &big_meta], "--meta", "4096"),
        (&["--credits", "-1"], "--credits", "whole number"),
        (&["--credits", "lots"], "--credits", "whole number"),
        (
            &["--credits", "4503599627370497"],
            "--credits",
            "4503599627370496",
        ),
        (&["--refill", "10/30s"], "--refill", "1 minute"),
        (&["--refill", "10/90500ms"], "--refill", "whole seconds"),
        (&["--refill", "-1/1d"], "--refill", "amount"),
        (&["--refill", "10"], "--refill", "1000/1d"),
        (
            &["--credits", "none", "--refill", "10/1d"],
            "--refill",
            "--credits none",
        ),
        // No credits to keep: it would leave the key none.
        (&["--refill", "none"], "--refill", "unlimited"),
        (&["--rate-limit", "0/1m"], "--rate-limit", "requests"),
        (&["--rate-limit", "10"], "--rate-limit", "100/1m"),
        // One bad flag refuses the good ones beside it.
        (
            &["--name", "fine", "--ip-allow", "10.0.0.1/8"],
            "--ip-allow",
            "host bits",
        ),
    ];
    for (args, flag, words) in bad {
        let all: Vec<&str> = ["keys", "update", id.as_str()]
            .iter()
            .chain(args.iter())
            .copied()
            .collect();
        let (code, out, err) = cli(&path, &all);
        assert_eq!(code, 2, "{args:?} was accepted: {out}");
        if !args.is_empty() {
            assert!(err.contains(flag), "{args:?} does not name {flag}: {err}");
        }
        assert!(err.contains(words), "{args:?}: {err}");
    }
    assert_eq!(cli_ok(&path, &["keys", "get", &id]), before);
    assert!(updates(&path, &id).is_empty());

    let (code, _, err) = cli(&path, &["keys", "update", "key_nope", "--name", "x"]);
    assert_eq!(code, 2);
    assert!(err.contains("no API key with id \"key_nope\""), "{err}");

    // A revoked key is refused by name, and stays as it was.
    let revoked = cli_ok(&path, &["keys", "revoke", &id]);
    let (code, _, err) = cli(&path, &["keys", "update", &id, "--enabled", "false"]);
    assert_eq!(code, 2);
    assert!(err.contains(&id) && err.contains("revoked"), "{err}");
    assert_eq!(cli_ok(&path, &["keys", "get", &id]), revoked);
    assert!(updates(&path, &id).is_empty());
}
