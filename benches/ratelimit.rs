//! Rate-limit decisions through the whole gateway (a real `mpg-gateway` process): requests
//! per second and latency with `rate_limit.backend = "local"` against `"redis"`.
//!
//! `cargo bench --bench ratelimit`. Uses its own Redis key prefix (deleted at the end),
//! binds 127.0.0.1:0 only, and is bounded in time; under `cargo test` it returns at once.
#[path = "../tests/common/mod.rs"]
mod common;
mod support;

use common::scale::{redis_url, RedisPrefix};
use common::*;
use std::sync::Arc;
use std::time::Duration;
use support::{load, Report};

const RUN: Duration = Duration::from_secs(6);

/// One gateway on `backend`; returns (sequential, concurrent) reports.
async fn run(backend: &str, prefix: &RedisPrefix) -> (Report, Report) {
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    cfg.set("log.level", "info,access=off");
    // Every request is decided, none refused: the cost of a decision, not of a 429.
    cfg.set("rate_limit.policies.default.requests", 1_000_000_000);
    cfg.set("rate_limit.policies.default.per", "1s");
    if backend == "redis" {
        cfg.redis(&redis_url(), &prefix.0);
    }
    let path = cfg.write();
    let mut keys = Vec::new();
    let s = seed(&path, "acme", "alice", "owner", "clusters:read");
    keys.push(s.key);
    for _ in 0..15 {
        keys.push(create_key(&path, "acme", "alice", "clusters:read").0);
    }
    let keys = Arc::new(keys);
    let gw = Gateway::start(&path);
    let target = gw.url("/api/v1/clusters?organization_id=acme");
    let _ = load(&target, keys.clone(), 4, 500, RUN).await; // warm the key cache
    let sequential = load(&target, keys.clone(), 1, usize::MAX, RUN).await;
    let concurrent = load(&target, keys, 16, usize::MAX, RUN).await;
    assert_eq!(
        sequential.failures + concurrent.failures,
        0,
        "requests failed"
    );
    (sequential, concurrent)
}

async fn bench() {
    let prefix = RedisPrefix::new();
    let (local_seq, local_conc) = run("local", &prefix).await;
    let (redis_seq, redis_conc) = run("redis", &prefix).await;
    println!("{}", local_seq.line("local, 1 client"));
    println!("{}", redis_seq.line("redis, 1 client"));
    println!("{}", local_conc.line("local, 16 clients"));
    println!("{}", redis_conc.line("redis, 16 clients"));
    let added = |r: &Report, l: &Report| (r.p50.as_secs_f64() - l.p50.as_secs_f64()) * 1e3;
    println!(
        "redis adds {:.3} ms at p50 with 1 client, {:.3} ms with 16",
        added(&redis_seq, &local_seq),
        added(&redis_conc, &local_conc)
    );
}

fn main() {
    support::run("ratelimit", bench());
}
