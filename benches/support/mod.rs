//! Load generation shared by the benches: concurrent keep-alive HTTP/1.1 clients hitting
//! a real gateway process for a bounded count and time, with latency percentiles.
#![allow(dead_code, unreachable_pub)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// True when run by `cargo bench` (which passes `--bench`); `cargo test --all-targets`
/// runs bench binaries without it, and then they return at once.
pub fn benchmarking() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// Runs `bench` on a two-thread runtime under `cargo bench --bench NAME`;
/// under `cargo test` (which only builds the bench) it says so and returns.
pub fn run(name: &str, bench: impl std::future::Future<Output = ()>) {
    if !benchmarking() {
        println!("{name} bench: skipped (run it with `cargo bench --bench {name}`)");
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(bench);
}

/// What one load run measured.
pub struct Report {
    pub requests: usize,
    pub failures: usize,
    pub elapsed: Duration,
    pub p50: Duration,
    pub p99: Duration,
}

impl Report {
    pub fn rps(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }

    pub fn line(&self, label: &str) -> String {
        format!(
            "{label:<40} {:>8.0} req/s  p50 {:>7.3} ms  p99 {:>7.3} ms  ({} requests, {} not 200, {:.1} s)",
            self.rps(),
            self.p50.as_secs_f64() * 1e3,
            self.p99.as_secs_f64() * 1e3,
            self.requests,
            self.failures,
            self.elapsed.as_secs_f64()
        )
    }
}

/// Sends `GET url` with `Authorization: Bearer keys[i]` for i = 0, 1, … (wrapping), from
/// `concurrency` tasks, until `max` requests or `limit` time; returns the figures.
pub async fn load(
    url: &str,
    keys: Arc<Vec<String>>,
    concurrency: usize,
    max: usize,
    limit: Duration,
) -> Report {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (next, keys, url) = (next.clone(), keys.clone(), url.to_string());
        tasks.push(tokio::spawn(async move {
            let client = reqwest::Client::builder()
                .no_proxy()
                .http1_only()
                .pool_max_idle_per_host(1)
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap();
            let mut latencies = Vec::new();
            let mut failures = 0;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= max || started.elapsed() >= limit {
                    break;
                }
                let key = &keys[i % keys.len()];
                let t = Instant::now();
                let ok = match client.get(&url).bearer_auth(key).send().await {
                    Ok(res) => {
                        let ok = res.status() == 200;
                        let _ = res.bytes().await;
                        ok
                    }
                    Err(_) => false,
                };
                latencies.push(t.elapsed());
                if !ok {
                    failures += 1;
                }
            }
            (latencies, failures)
        }));
    }
    let mut latencies = Vec::new();
    let mut failures = 0;
    for task in tasks {
        let (l, f) = task.await.unwrap();
        latencies.extend(l);
        failures += f;
    }
    let elapsed = started.elapsed();
    latencies.sort_unstable();
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    Report {
        requests: latencies.len(),
        failures,
        elapsed,
        p50: pct(0.50),
        p99: pct(0.99),
    }
}
