//! Metrics: every metric's name and description, the process-wide
//! Prometheus recorder, the `/metrics` page (with the process metrics), and
//! [`CounterCache`], the per-request path's way to count without building a
//! labelled key each time.
use metrics::Unit;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use std::sync::OnceLock;
use std::time::Duration;
use Kind::{Counter, Gauge, Histogram};

/// Metric names, in one place so dashboards and code agree.
pub mod names {
    /// Gauge: always 1, by `version` (the gateway's), so a query can join
    /// any series to the version that produced it.
    pub const BUILD_INFO: &str = "mpg_build_info";
    /// Counter: requests by `route` (template or `-`), `method`, `status`.
    pub const REQUESTS: &str = "mpg_requests_total";
    /// Histogram: request latency in seconds by `route`.
    pub const REQUEST_SECONDS: &str = "mpg_request_duration_seconds";
    /// Counter: authentication outcomes by `result` (`ok`/`refused`/`error`) and `reason`.
    pub const AUTH: &str = "mpg_auth_decisions_total";
    /// Counter: rate-limit decisions by `policy` and `decision` (`allowed`/`limited`).
    pub const RATE_LIMIT: &str = "mpg_rate_limit_decisions_total";
    /// Counter: requests a `mode = "shadow"` policy would have refused (and
    /// let through), by `policy`.
    pub const RATE_LIMIT_SHADOW_REFUSALS: &str = "mpg_ratelimit_shadow_refusals_total";
    /// Counter: failed calls to the shared rate-limit backend (Redis) by `backend`.
    pub const RATE_LIMIT_BACKEND_ERRORS: &str = "mpg_rate_limit_backend_errors_total";
    /// Histogram: seconds per call to the shared rate-limit backend (Redis), by `backend`.
    pub const RATE_LIMIT_BACKEND_SECONDS: &str = "mpg_rate_limit_backend_duration_seconds";
    /// Gauge: key-cache entries, positive and negative.
    pub const CACHE_ENTRIES: &str = "mpg_key_cache_entries";
    /// Gauge: "not found" key-cache entries (a bound of their own:
    /// `store.negative_cache_capacity` per tier).
    pub const CACHE_NEGATIVE_ENTRIES: &str = "mpg_key_cache_negative_entries";
    /// Counter: key-cache lookups by `result` (`hit`, `stale`, `miss`).
    pub const CACHE_LOOKUPS: &str = "mpg_key_cache_lookups_total";
    /// Counter: store lookups that failed (unavailable or timeout).
    pub const STORE_ERRORS: &str = "mpg_store_errors_total";
    /// Gauge: 1 while the key store's circuit breaker is open (or probing), else 0.
    pub const STORE_BREAKER_OPEN: &str = "mpg_store_breaker_open";
    /// Counter: circuit breaker transitions by `to` (`open`, `closed`).
    pub const STORE_BREAKER_TRANSITIONS: &str = "mpg_store_breaker_transitions_total";
    /// Counter: probes of an open circuit breaker by `result` (`ok`, `failed`).
    pub const STORE_BREAKER_PROBES: &str = "mpg_store_breaker_probes_total";
    /// Counter: whole-cache clears by the change follower, by `reason`
    /// (`store_gap`, `change_log_pruned`).
    pub const CACHE_CLEARS: &str = "mpg_key_cache_clears_total";
    /// Counter: change-log records this instance deleted past the retention.
    pub const CHANGES_PRUNED: &str = "mpg_store_changes_pruned_total";
    /// Histogram: seconds per store query or commit (cache misses, key service, admin).
    pub const STORE_SECONDS: &str = "mpg_store_query_duration_seconds";
    /// Counter: upstream responses and failures by `upstream` and `outcome`.
    pub const UPSTREAM: &str = "mpg_upstream_requests_total";
    /// Histogram: seconds from a request's hand-over to its upstream to the
    /// upstream's response head, by `upstream`; answers only (failures are
    /// counted by outcome in [`UPSTREAM`]).
    pub const UPSTREAM_SECONDS: &str = "mpg_upstream_duration_seconds";
    /// Counter: extra attempts on another target after a connect failure, by `upstream`.
    pub const UPSTREAM_RETRIES: &str = "mpg_upstream_retries_total";
    /// Counter: targets taken out of rotation, by `upstream` and `target` (as configured).
    pub const UPSTREAM_EJECTIONS: &str = "mpg_upstream_target_ejections_total";
    /// Gauge: 1 while a target is in rotation, 0 while ejected, by `upstream` and `target`.
    pub const UPSTREAM_TARGET_UP: &str = "mpg_upstream_target_up";
    /// Gauge: open client connections.
    pub const CONNECTIONS: &str = "mpg_open_connections";
    /// Counter: TLS handshakes by `result`.
    pub const TLS_HANDSHAKES: &str = "mpg_tls_handshakes_total";
    /// Counter: configuration reloads by `result` (`ok` / `error`).
    pub const RELOADS: &str = "mpg_config_reloads_total";
    /// Counter: on a Redis Cluster, decisions that fell back because the
    /// primary serving their key's slot was failing, by `node` (`host:port`).
    pub const RATE_LIMIT_NODE_FALLBACKS: &str = "mpg_rate_limit_node_fallbacks_total";
    /// Counter: JWTs checked against the identity provider's key set, by
    /// `outcome` (`ok`, `malformed`, `invalid`, `expired`, `not_yet_valid`,
    /// `no_key_set`); a cached token is not checked again.
    pub const JWT_VERIFICATIONS: &str = "mpg_jwt_verifications_total";
    /// Counter: fetches of the identity provider's key set by `outcome`
    /// (`ok`, `error`: unreachable or not 200, `invalid`: a document refused).
    pub const JWKS_REFRESHES: &str = "mpg_jwks_refreshes_total";
    /// Counter: finished spans that never reached the collector: the export
    /// queue was full, or their batch failed to export.
    pub const TRACE_SPANS_DROPPED: &str = "mpg_trace_spans_dropped_total";
}

/// What a metric is: its kind, the labels it may carry and its `# HELP`
/// text, which the recorder is told once, when it is installed.
#[derive(Debug, Clone, Copy)]
pub struct Description {
    pub name: &'static str,
    pub kind: Kind,
    /// Every label name its series may carry (a series may carry fewer).
    pub labels: &'static [&'static str],
    pub help: &'static str,
}

/// A metric's Prometheus type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    /// Always in seconds.
    Histogram,
}

/// One row of [`DESCRIPTIONS`].
const fn d(
    kind: Kind,
    name: &'static str,
    labels: &'static [&'static str],
    help: &'static str,
) -> Description {
    Description {
        name,
        kind,
        labels,
        help,
    }
}

/// Every name in [`names`], described (a test checks none is missing). The
/// `process_*` metrics are described by `metrics-process`.
// One metric a line, as a table: rustfmt would break each into five.
#[rustfmt::skip]
pub const DESCRIPTIONS: &[Description] = &[
    d(Counter, names::REQUESTS, &["route", "method", "status"], "Requests answered, by route template (- when none matched), method and status."),
    d(Histogram, names::REQUEST_SECONDS, &["route"], "Seconds from a request's head read to its response head ready, the upstream's answer included, by route template."),
    d(Counter, names::AUTH, &["result", "reason"], "Authentication outcomes by result (ok, refused, error) and reason."),
    d(Counter, names::RATE_LIMIT, &["policy", "decision"], "Rate-limit decisions by policy and decision (allowed, limited); a shadow policy's limited requests were let through."),
    d(Counter, names::RATE_LIMIT_SHADOW_REFUSALS, &["policy"], "Requests a shadow policy would have refused and let through, by policy."),
    d(Counter, names::RATE_LIMIT_BACKEND_ERRORS, &["backend"], "Failed or timed-out calls to the shared rate-limit backend; those decisions follow on_backend_error."),
    d(Histogram, names::RATE_LIMIT_BACKEND_SECONDS, &["backend"], "Seconds per call to the shared rate-limit backend, failures included."),
    d(Counter, names::RATE_LIMIT_NODE_FALLBACKS, &["node"], "On a Redis Cluster, decisions that followed on_backend_error because the primary serving their key's slot was failing, by node."),
    d(Gauge, names::CACHE_ENTRIES, &[], "Key-cache entries, positive and negative."),
    d(Gauge, names::CACHE_NEGATIVE_ENTRIES, &[], "Key-cache entries that say no such key or token."),
    d(Counter, names::CACHE_LOOKUPS, &["result"], "Key-cache lookups by result (hit, stale, miss)."),
    d(Counter, names::CACHE_CLEARS, &["reason"], "Whole key-cache clears by the change follower, by reason (store_gap, change_log_pruned)."),
    d(Counter, names::STORE_ERRORS, &[], "Key-store lookups that failed or timed out."),
    d(Gauge, names::STORE_BREAKER_OPEN, &[], "1 while the key store's circuit breaker is open or probing, else 0."),
    d(Counter, names::STORE_BREAKER_TRANSITIONS, &["to"], "Key-store circuit breaker transitions, by the state entered (open, closed)."),
    d(Counter, names::STORE_BREAKER_PROBES, &["result"], "Probes of the key store while its circuit breaker is open, by result (ok, failed)."),
    d(Counter, names::CHANGES_PRUNED, &[], "Change-log records this instance deleted past the retention."),
    d(Histogram, names::STORE_SECONDS, &[], "Seconds per key-store query or commit, timeouts included."),
    d(Counter, names::UPSTREAM, &["upstream", "outcome"], "Requests handed to an upstream, by upstream and outcome (response, or the failure)."),
    d(Histogram, names::UPSTREAM_SECONDS, &["upstream"], "Seconds from a request's hand-over to its upstream to the response head, answers only, by upstream."),
    d(Counter, names::UPSTREAM_RETRIES, &["upstream"], "Extra attempts on another target after a connect failure, by upstream."),
    d(Counter, names::UPSTREAM_EJECTIONS, &["upstream", "target"], "Targets taken out of rotation, by upstream and target."),
    d(Gauge, names::UPSTREAM_TARGET_UP, &["upstream", "target"], "1 while a target is in rotation, 0 while it is ejected, by upstream and target."),
    d(Gauge, names::CONNECTIONS, &["listener"], "Open client connections, by listener."),
    d(Counter, names::TLS_HANDSHAKES, &["result", "version", "group"], "TLS handshakes by result (ok, error, timeout); a completed one by protocol version and key exchange group."),
    d(Counter, names::RELOADS, &["result"], "Configuration reloads by result (ok, error: refused, the running configuration stays)."),
    d(Counter, names::JWT_VERIFICATIONS, &["outcome"], "JWTs checked against the identity provider's key set, by outcome."),
    d(Counter, names::JWKS_REFRESHES, &["outcome"], "Fetches of the identity provider's key set, by outcome (ok, error, invalid)."),
    d(Counter, names::TRACE_SPANS_DROPPED, &[], "Finished trace spans that never reached the collector: the export queue was full, or their batch failed to export."),
    d(Gauge, names::BUILD_INFO, &["version"], "Always 1, labelled with the running gateway's version."),
];

/// Tells the installed recorder every metric's description, sets the
/// series that must exist from the start, and describes the process
/// metrics.
fn describe(process: &metrics_process::Collector) {
    for d in DESCRIPTIONS {
        match d.kind {
            Kind::Counter => metrics::describe_counter!(d.name, Unit::Count, d.help),
            Kind::Gauge => metrics::describe_gauge!(d.name, d.help),
            Kind::Histogram => metrics::describe_histogram!(d.name, Unit::Seconds, d.help),
        }
    }
    metrics::gauge!(names::BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    // At 0 from the start: a series that first appears at 1 shows no
    // increase, so an alert on the first dropped span or refused reload
    // would never fire.
    metrics::counter!(names::TRACE_SPANS_DROPPED).increment(0);
    for result in ["ok", "error"] {
        metrics::counter!(names::RELOADS, "result" => result).increment(0);
    }
    process.describe();
}

/// The `/metrics` page: the process metrics read now, then every series.
pub fn render(handle: &PrometheusHandle) -> String {
    if let Some(process) = PROCESS.get() {
        process.collect();
    }
    handle.render()
}

/// The process metrics' collector, set when this process's recorder is
/// installed (never when another recorder was there first).
static PROCESS: OnceLock<metrics_process::Collector> = OnceLock::new();

/// The process-wide Prometheus recorder (installed once).
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                // Fine below a millisecond, where a gateway's own time and a
                // cached store lookup fall.
                .set_buckets(&[
                    0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                    0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                ])
                .unwrap_or_else(|_| PrometheusBuilder::new());
            match builder.install_recorder() {
                Ok(handle) => {
                    describe(PROCESS.get_or_init(metrics_process::Collector::default));
                    let upkeep = handle.clone();
                    // Histograms need periodic upkeep when no exporter thread runs.
                    std::thread::spawn(move || loop {
                        std::thread::sleep(Duration::from_secs(5));
                        upkeep.run_upkeep();
                    });
                    handle
                }
                // Another recorder is installed (embedding): render an empty page.
                Err(_) => PrometheusBuilder::new().build_recorder().handle(),
            }
        })
        .clone()
}

/// Counter handles of one metric family whose label values come from small
/// fixed sets (a method, a status, an outcome), made on first use and then
/// reused: `counter!` with labels builds, hashes and looks up a key on every
/// call, which the per-request path should not pay.
pub(crate) struct CounterCache<K: Labels> {
    make: Box<dyn Fn(&K) -> metrics::Counter + Send + Sync>,
    made: std::sync::RwLock<foldhash::HashMap<LabelsId, metrics::Counter>>,
}

/// Label values that are `'static` strings, found by where they lie rather
/// than by their text: no hashing or comparing of bytes per lookup. The same
/// text at two addresses gets two handles to the one registered counter, so
/// counts are right either way.
pub(crate) trait Labels {
    fn id(&self) -> LabelsId;
}

/// Where up to two label strings lie (address and length of each). Hashed
/// as one word (equality still compares all four).
#[derive(PartialEq, Eq)]
pub(crate) struct LabelsId([usize; 4]);

impl std::hash::Hash for LabelsId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let [a, b, c, d] = self.0.map(|w| w as u64);
        state.write_u64(a ^ b.rotate_left(16) ^ c.rotate_left(32) ^ d.rotate_left(48));
    }
}

impl Labels for &'static str {
    fn id(&self) -> LabelsId {
        LabelsId([self.as_ptr() as usize, self.len(), 0, 0])
    }
}

impl Labels for (&'static str, &'static str) {
    fn id(&self) -> LabelsId {
        LabelsId([
            self.0.as_ptr() as usize,
            self.0.len(),
            self.1.as_ptr() as usize,
            self.1.len(),
        ])
    }
}

impl<K: Labels> CounterCache<K> {
    /// A cache whose handles `make` registers.
    pub(crate) fn new(make: impl Fn(&K) -> metrics::Counter + Send + Sync + 'static) -> Self {
        CounterCache {
            make: Box::new(make),
            made: Default::default(),
        }
    }

    /// Adds one to the counter for `labels`.
    pub(crate) fn increment(&self, labels: K) {
        let id = labels.id();
        let made = self.made.read().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = made.get(&id) {
            c.increment(1);
            return;
        }
        drop(made);
        let c = (self.make)(&labels);
        c.increment(1);
        self.made
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// The values of the `pub const`s in `mod names`, read from this file.
    fn names_in_source() -> Vec<&'static str> {
        let source = include_str!("metrics.rs");
        let start = source.find("pub mod names {").expect("mod names");
        let end = start + source[start..].find("\n}\n").expect("end of mod names");
        source[start..end]
            .lines()
            .filter_map(|l| l.trim().strip_prefix("pub const "))
            .map(|l| l.split('"').nth(1).expect("a string constant"))
            .collect()
    }

    #[test]
    fn every_name_is_described_once_and_every_description_is_a_name() {
        let names = names_in_source();
        assert!(names.len() >= 30, "{names:?}");
        for name in &names {
            let n = DESCRIPTIONS.iter().filter(|d| d.name == *name).count();
            assert_eq!(n, 1, "{name} is described {n} times");
        }
        for d in DESCRIPTIONS {
            assert!(names.contains(&d.name), "{} is not in `names`", d.name);
            assert!(!d.help.is_empty(), "{}", d.name);
            assert!(d.name.starts_with("mpg_"), "{}", d.name);
        }
    }

    #[test]
    fn names_follow_prometheus_conventions() {
        for d in DESCRIPTIONS {
            let total = d.name.ends_with("_total");
            match d.kind {
                Kind::Counter => assert!(total, "counter {} must end in _total", d.name),
                Kind::Gauge => assert!(!total, "gauge {} must not end in _total", d.name),
                Kind::Histogram => {
                    assert!(d.name.ends_with("_seconds"), "histogram {}", d.name)
                }
            }
            assert!(
                d.name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{}",
                d.name
            );
        }
    }

    #[test]
    fn the_page_has_help_for_every_family_build_info_dropped_spans_and_process_metrics() {
        let page = render(&metrics_handle());
        assert!(
            page.contains(&format!(
                "mpg_build_info{{version=\"{}\"}} 1\n",
                env!("CARGO_PKG_VERSION")
            )),
            "{page}"
        );
        assert!(
            page.contains("\nmpg_trace_spans_dropped_total 0\n"),
            "{page}"
        );
        for family in ["process_resident_memory_bytes", "process_cpu_seconds_total"] {
            assert!(page.contains(&format!("# HELP {family} ")), "{page}");
        }
        for line in page.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
            let family = line.split(' ').next().unwrap();
            assert!(
                page.contains(&format!("# HELP {family} ")),
                "{family}: {page}"
            );
        }
    }

    #[test]
    fn labels_found_by_address_still_count_into_one_counter_per_text() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            let made = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let seen = made.clone();
            let cache = CounterCache::new(move |&(a, b): &(&'static str, &'static str)| {
                seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                metrics::counter!("t_total", "a" => a, "b" => b)
            });
            // The same text at another address: a leaked copy.
            let other: &'static str = Box::leak(String::from("GET").into_boxed_str());
            cache.increment(("GET", "200"));
            cache.increment(("GET", "200"));
            cache.increment((other, "200"));
            cache.increment(("GET", "404"));
            assert_eq!(made.load(std::sync::atomic::Ordering::Relaxed), 3);
        });
        let page = handle.render();
        assert!(page.contains(r#"t_total{a="GET",b="200"} 3"#), "{page}");
        assert!(page.contains(r#"t_total{a="GET",b="404"} 1"#), "{page}");
    }
}
