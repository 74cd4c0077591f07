//! Authenticated requests per second through the whole gateway (a real `mpg-gateway`
//! process) with 100 000 API keys in PostgreSQL, the key cache warm and cold.
//!
//! `cargo bench --bench store`. Creates its own database (dropped at the end), binds
//! 127.0.0.1:0 only, and is bounded in time; under `cargo test` it returns at once.
#[path = "../tests/common/mod.rs"]
mod common;
mod support;

use common::scale::PgDb;
use common::*;
use sqlx::postgres::PgPoolOptions;
use std::sync::Arc;
use std::time::Duration;
use support::load;

const KEYS: usize = 100_000;
const BATCH: usize = 10_000;
const CONCURRENCY: usize = 16;
const RUN: Duration = Duration::from_secs(8);

/// Inserts `n` keys for acme/alice straight into `api_keys` (the store's own secret
/// format and hashing); returns their secrets.
async fn bulk_insert(url: &str, n: usize) -> Vec<String> {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await
        .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let mut secrets = Vec::with_capacity(n);
    for start in (0..n).step_by(BATCH) {
        let count = BATCH.min(n - start);
        let (mut ids, mut hashes, mut prefixes) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..count {
            let (secret, prefix) = mpg_gateway::secret::generate_api_key();
            ids.push(mpg_gateway::secret::generate_key_id());
            hashes.push(mpg_gateway::secret::hash_secret(&secret).to_hex());
            prefixes.push(prefix);
            secrets.push(secret);
        }
        sqlx::query(
            "INSERT INTO api_keys (id, key_hash, prefix, name, organization_id, user_id, \
             scopes, created_at) \
             SELECT id, h, p, 'bench', 'acme', 'alice', 'clusters:read', $4 \
             FROM UNNEST($1::text[], $2::text[], $3::text[]) AS t(id, h, p)",
        )
        .bind(&ids)
        .bind(&hashes)
        .bind(&prefixes)
        .bind(now)
        .execute(&pool)
        .await
        .unwrap();
    }
    pool.close().await;
    secrets
}

async fn bench() {
    let db = PgDb::create().await;
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    cfg.postgres(&db.url);
    cfg.set("log.level", "info,access=off");
    cfg.set("rate_limit.policies.default.requests", 1_000_000_000);
    cfg.set("rate_limit.policies.default.per", "1s");
    let path = cfg.write();
    let _ = seed(&path, "acme", "alice", "owner", "clusters:read");
    let started = std::time::Instant::now();
    let secrets = Arc::new(bulk_insert(&db.url, KEYS).await);
    println!(
        "inserted {KEYS} keys in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // Warm: 1 000 keys, each cached after its first use (warm-up pass first).
    let gw = Gateway::start(&path);
    let target = gw.url("/api/v1/clusters?organization_id=acme");
    let hot = Arc::new(secrets[..1_000].to_vec());
    let _ = load(&target, hot.clone(), CONCURRENCY, 1_000, RUN).await;
    let warm = load(&target, hot, CONCURRENCY, usize::MAX, RUN).await;
    println!("{}", warm.line("cache warm (1 000 hot keys)"));
    drop(gw);

    // Cold: a fresh gateway, every request a key it has never seen (a store query each).
    let gw = Gateway::start(&path);
    let target = gw.url("/api/v1/clusters?organization_id=acme");
    let cold = load(&target, secrets.clone(), CONCURRENCY, KEYS, RUN).await;
    println!("{}", cold.line("cache cold (each request a new key)"));
    assert_eq!(warm.failures + cold.failures, 0, "requests failed");
}

fn main() {
    support::run("store", bench());
}
