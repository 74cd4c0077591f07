//! TLS to the gateway's backends, against servers the tests start with TLS
//! on: the shared limiter on a Redis that speaks only TLS (`rediss://` and
//! `rate_limit.redis_ca_file`), and the key store on a PostgreSQL that accepts
//! only TLS connections (`sslmode=verify-full&sslrootcert=…`). A certificate
//! from another CA is refused, and the error says it is a certificate problem.
mod common;

use common::backends::{TlsPostgres, TlsRedis};
use common::*;
use serde_json::Value;
use sqlx::{Connection, Executor, PgConnection};
use std::path::Path;

/// Policy `ip`: 3 requests an hour per client IP, on `/public/ping`, counted
/// in the Redis at `url` trusting `ca`; refusing everything while Redis fails.
fn limited(up: &MockUpstream, url: &str, ca: Option<&Path>) -> TestConfig {
    let mut cfg = TestConfig::new(up.addr);
    cfg.set("rate_limit.policies.ip.requests", 3);
    cfg.set("rate_limit.policies.ip.per", "1h");
    cfg.set("rate_limit.policies.ip.key", "client_ip");
    cfg.route("method = \"GET\"\npath = \"/public/ping\"\nauth = \"none\"\nupstream = \"clusters\"\nrate_limit = \"ip\"");
    cfg.set("rate_limit.backend", "redis");
    cfg.set("rate_limit.redis_url", url);
    if let Some(ca) = ca {
        cfg.set("rate_limit.redis_ca_file", ca.to_str().unwrap());
    }
    // Generous: the first TLS handshake on a busy machine must not fall back.
    cfg.set("rate_limit.redis_timeout", "2s");
    cfg.set("rate_limit.on_backend_error", "deny");
    cfg
}

async fn status(gw: &Gateway, path: &str) -> u16 {
    client()
        .get(gw.url(path))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limiter_counts_in_a_redis_reached_over_tls_with_a_private_ca() {
    let redis = TlsRedis::start();
    let up = MockUpstream::start().await;
    let cfg = limited(&up, &redis.url(), Some(&redis.pki.ca));
    let path = cfg.write();
    let gws = [Gateway::start(&path), Gateway::start(&path)];
    let mut seen = Vec::new();
    for i in 0..5 {
        seen.push(status(&gws[i % 2], "/public/ping").await);
    }
    // One bucket for both instances: three in all, then refusals. With Redis
    // failing, `deny` would have refused the first.
    assert_eq!(seen, [200, 200, 200, 429, 429]);
    let keys = redis.cli(&["--scan", "--pattern", "mpg:rl:*"]);
    assert!(
        keys.contains(":127.0.0.1"),
        "bucket not in the TLS Redis: {keys:?}"
    );
    for gw in &gws {
        let log = gw.log_text();
        assert!(!log.contains("rate-limit backend redis"), "{log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_certificate_from_another_ca_is_refused_and_said_so() {
    let redis = TlsRedis::start();
    let up = MockUpstream::start().await;
    // Another CA, and no CA file at all (the system roots lack the test CA).
    let other = limited(&up, &redis.url(), Some(&redis.pki.other_ca));
    let system = limited(&up, &redis.url(), None);
    for cfg in [other, system] {
        let gw = Gateway::start(&cfg.write());
        assert_eq!(
            status(&gw, "/public/ping").await,
            429,
            "deny while Redis fails"
        );
        let log = gw.log_text();
        let line = log
            .lines()
            .find(|l| l.contains("rate-limit backend redis"))
            .unwrap_or_else(|| panic!("no limiter failure logged:\n{log}"));
        assert!(
            line.contains("invalid peer certificate") && line.contains("UnknownIssuer"),
            "{line}"
        );
    }
    let keys = redis.cli(&["--scan", "--pattern", "mpg:*"]);
    assert!(keys.trim().is_empty(), "{keys:?}");
}

/// A database `gw` on `pg`, made over TLS (the server takes nothing else).
async fn create_database(pg: &TlsPostgres) {
    let mut admin = PgConnection::connect(&pg.url("postgres", "sslmode=require"))
        .await
        .unwrap();
    admin.execute("CREATE DATABASE gw").await.unwrap();
    admin.close().await.unwrap();
}

/// How many of the connections to `gw` use TLS, and how many there are.
async fn tls_connections(pg: &TlsPostgres) -> (i64, i64) {
    let mut admin = PgConnection::connect(&pg.url("postgres", "sslmode=require"))
        .await
        .unwrap();
    let row: (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE s.ssl), count(*) FROM pg_stat_activity a \
         JOIN pg_stat_ssl s USING (pid) WHERE a.datname = 'gw'",
    )
    .fetch_one(&mut admin)
    .await
    .unwrap();
    admin.close().await.unwrap();
    row
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_is_reached_over_tls_with_verify_full_and_a_ca_file() {
    let pg = TlsPostgres::start();
    create_database(&pg).await;
    let up = MockUpstream::start().await;
    let ca = pg.pki.ca.display().to_string();
    let mut cfg = TestConfig::new(up.addr);
    cfg.postgres(&pg.url("gw", &format!("sslmode=verify-full&sslrootcert={ca}")));
    let path = cfg.write();
    let (code, _, err) = cli(&path, &["check-config"]);
    assert_eq!(code, 0, "{err}");

    // The admin commands and the gateway both reach the store.
    let seed = seed(&path, "acme", "alice", "owner", "clusters:read");
    let gw = Gateway::start(&path);
    let res = client()
        .get(gw.url("/api/v1/clusters?organization_id=acme"))
        .bearer_auth(&seed.key)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let (tls, all) = tls_connections(&pg).await;
    assert!(all > 0 && tls == all, "{tls} of {all} connections use TLS");

    // The certificate is checked: another CA fails, and says why.
    let mut wrong = TestConfig::new(up.addr);
    let other = pg.pki.other_ca.display();
    wrong.postgres(&pg.url("gw", &format!("sslmode=verify-full&sslrootcert={other}")));
    let wrong_path = wrong.write();
    let (code, json, err) = cli(&wrong_path, &["orgs", "create", "--id", "other"]);
    assert_ne!(code, 0, "{json}");
    assert_eq!(json, Value::Null);
    assert!(
        err.contains("invalid peer certificate") && err.contains("UnknownIssuer"),
        "{err}"
    );
    let started = Gateway::try_start(&wrong_path);
    let log = started
        .err()
        .expect("a gateway that cannot trust its store must not start");
    assert!(log.contains("invalid peer certificate"), "{log}");
}
