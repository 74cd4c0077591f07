//! One rate-limit decision in our GCRA (`LocalLimiter`) beside the `governor` crate's keyed
//! limiter (`DefaultKeyedRateLimiter<String>`: a `DashMap` on the std hasher, the quanta
//! clock), each with its own real clock and the same quota, and the memory each holds
//! after 100 000 keys. `docs/architecture.md` says why the gateway keeps its own.
//!
//! `cargo bench --bench gcra_vs_governor`. The cases:
//! - `one_key`: the same key every time, a quota it never exhausts;
//! - `100k_keys_refilled`: rotating over 100 000 keys, each bucket full again before its
//!   key comes back (ours forgets full buckets, so it re-inserts; governor keeps them all);
//! - `100k_keys_live`: rotating over 100 000 keys whose buckets stay partly spent, so both
//!   limiters keep every key and the decision is a lookup of a tracked key;
//! - `clock_read`: the clock read inside each decision, alone.
//!
//! governor looks keys up by its owned key type. The gateway's keys are `&str` (an
//! organization id, a client address), so `governor` builds the `String` a check needs,
//! as the gateway would; `governor_owned_key` passes one built beforehand (its lower bound).
//! Both run on mimalloc, the gateway's allocator, so that `String` costs what it would there.
//!
//! Times are the bench thread's CPU time, not wall time: on a machine shared with other
//! work, time spent preempted would otherwise land on whichever side was running.
use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use governor::clock::{Clock as _, DefaultClock};
use governor::{DefaultKeyedRateLimiter, RateLimiter};
use mpg_gateway::ratelimit::{Clock as _, LocalLimiter, PolicyId, Quota, SystemClock};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The calling thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), in nanoseconds, shown as
/// criterion shows wall time.
struct ThreadCpuTime(WallTime);

impl Measurement for ThreadCpuTime {
    type Intermediate = u64;
    type Value = u64;

    fn start(&self) -> u64 {
        thread_cpu_nanos()
    }
    fn end(&self, start: u64) -> u64 {
        thread_cpu_nanos().saturating_sub(start)
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, nanos: &u64) -> f64 {
        *nanos as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        self.0.formatter()
    }
}

fn thread_cpu_nanos() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

type Bench = Criterion<ThreadCpuTime>;

const KEYS: usize = 100_000;
const POLICY: PolicyId = PolicyId(0);

/// A quota never exhausted by one hot key: 10^9 per second, one token back every
/// nanosecond, so a bucket is full again by the time its key comes round.
const FAST_CAPACITY: u32 = 1_000_000_000;
const FAST_PERIOD: Duration = Duration::from_secs(1);
/// A quota whose buckets stay partly spent between visits (one token back every 6 s)
/// and never run dry within a run (10^6 tokens for a few hundred visits per key).
const SLOW_CAPACITY: u32 = 1_000_000;
const SLOW_PERIOD: Duration = Duration::from_secs(6_000_000);

fn ours(capacity: u32, period: Duration) -> LocalLimiter {
    LocalLimiter::new(vec![Quota::new(NonZeroU32::new(capacity).unwrap(), period)])
}

fn theirs(capacity: u32, period: Duration) -> DefaultKeyedRateLimiter<String> {
    let capacity = NonZeroU32::new(capacity).unwrap();
    let quota = governor::Quota::with_period(period / capacity.get())
        .unwrap()
        .allow_burst(capacity);
    RateLimiter::keyed(quota)
}

fn keys() -> Vec<String> {
    (0..KEYS).map(|i| format!("key_{i:016}")).collect()
}

/// Resident set size from `/proc/self/status`, in KiB (None off Linux).
fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Keys tracked and resident memory added after one decision for each of 100 000 keys, in
/// both regimes. Printed first, before any bench has allocated; every limiter stays alive
/// to the end so that none reuses memory another freed.
fn memory(_: &mut Bench) {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let keys = keys();
    let mut kept = Vec::new();
    let mut kept_governor = Vec::new();
    println!("memory after one decision for each of {KEYS} keys (tracked keys, RSS added):");
    for (regime, capacity, period) in [
        ("refilled", FAST_CAPACITY, FAST_PERIOD),
        ("live", SLOW_CAPACITY, SLOW_PERIOD),
    ] {
        let before = rss_kib();
        let limiter = ours(capacity, period);
        for k in &keys {
            assert!(limiter.check(POLICY, k).allowed);
        }
        let added = rss_kib().zip(before).map(|(a, b)| a.saturating_sub(b));
        println!(
            "  {regime:>8}  ours      {:>7} keys  {:>7} KiB",
            limiter.tracked_keys(POLICY),
            added.map_or("?".into(), |a| a.to_string())
        );
        kept.push(limiter);
        let before = rss_kib();
        let limiter = theirs(capacity, period);
        for k in &keys {
            assert!(limiter.check_key(&k.to_owned()).is_ok());
        }
        let added = rss_kib().zip(before).map(|(a, b)| a.saturating_sub(b));
        println!(
            "  {regime:>8}  governor  {:>7} keys  {:>7} KiB",
            limiter.len(),
            added.map_or("?".into(), |a| a.to_string())
        );
        kept_governor.push(limiter);
    }
}

fn one_key(c: &mut Bench) {
    const KEY: &str = "key_0000000000000000";
    let mut g = c.benchmark_group("one_key");
    g.throughput(Throughput::Elements(1));
    let limiter = ours(FAST_CAPACITY, FAST_PERIOD);
    g.bench_function("ours", |b| {
        b.iter(|| limiter.check(POLICY, black_box(KEY)).allowed)
    });
    let limiter = theirs(FAST_CAPACITY, FAST_PERIOD);
    g.bench_function("governor", |b| {
        b.iter(|| limiter.check_key(&black_box(KEY).to_owned()).is_ok())
    });
    let owned = KEY.to_owned();
    g.bench_function("governor_owned_key", |b| {
        b.iter(|| limiter.check_key(black_box(&owned)).is_ok())
    });
    g.finish();
}

/// Rotates over [`KEYS`] keys under `capacity` per `period`, after one pass to track them.
fn rotating(c: &mut Bench, group: &str, capacity: u32, period: Duration) {
    let keys = keys();
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(1));
    let limiter = ours(capacity, period);
    for k in &keys {
        limiter.check(POLICY, k);
    }
    let mut i = 0;
    g.bench_function("ours", |b| {
        b.iter(|| {
            i = (i + 1) % KEYS;
            limiter.check(POLICY, black_box(keys[i].as_str())).allowed
        })
    });
    assert!(limiter.check(POLICY, &keys[0]).allowed, "{group}: refused");
    println!("{group}: ours tracks {} keys", limiter.tracked_keys(POLICY));
    let limiter = theirs(capacity, period);
    for k in &keys {
        let _ = limiter.check_key(k);
    }
    g.bench_function("governor", |b| {
        b.iter(|| {
            i = (i + 1) % KEYS;
            limiter
                .check_key(&black_box(keys[i].as_str()).to_owned())
                .is_ok()
        })
    });
    g.bench_function("governor_owned_key", |b| {
        b.iter(|| {
            i = (i + 1) % KEYS;
            limiter.check_key(black_box(&keys[i])).is_ok()
        })
    });
    assert!(limiter.check_key(&keys[0]).is_ok(), "{group}: refused");
    println!("{group}: governor tracks {} keys", limiter.len());
    g.finish();
}

fn keys_refilled(c: &mut Bench) {
    rotating(c, "100k_keys_refilled", FAST_CAPACITY, FAST_PERIOD);
}

fn keys_live(c: &mut Bench) {
    rotating(c, "100k_keys_live", SLOW_CAPACITY, SLOW_PERIOD);
}

fn clock_read(c: &mut Bench) {
    let mut g = c.benchmark_group("clock_read");
    g.throughput(Throughput::Elements(1));
    let clock = SystemClock::new();
    g.bench_function("ours", |b| b.iter(|| clock.now_nanos()));
    let clock = DefaultClock::default();
    g.bench_function("governor", |b| b.iter(|| clock.now()));
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().with_measurement(ThreadCpuTime(WallTime));
    targets = memory, one_key, keys_refilled, keys_live, clock_read
}
criterion_main!(benches);
