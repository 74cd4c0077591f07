//! OpenTelemetry tracing end to end: a real gateway exports to a collector
//! in the test ([`common::otlp`]), which decodes what arrives, and a real
//! upstream records the `traceparent` it gets.
mod common;

use common::otlp::{Collector, Span};
use common::scale::{metric_sum, metrics, redis_url, within, RedisPrefix};
use common::*;
use serde_json::Value;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

const CLUSTERS: &str = "/api/v1/clusters?organization_id=acme";

/// A gateway exporting every new trace to `collector` with `protocol`.
fn traced(up: &MockUpstream, endpoint: &str, protocol: &str, ratio: f64) -> TestConfig {
    let mut cfg = TestConfig::new(up.addr);
    cfg.set("tracing.otlp_endpoint", endpoint);
    cfg.set("tracing.protocol", protocol);
    cfg.set("tracing.sample_ratio", ratio);
    cfg.set("tracing.service_name", "gateway-under-test");
    cfg
}

/// A traced gateway (with the shipped routes) in front of a recording
/// upstream, exporting to a collector, and alice's key in acme with `scopes`.
struct Traced {
    collector: Collector,
    up: MockUpstream,
    gw: Gateway,
    seed: Seed,
    /// Its directory holds the store: it lives as long as the test.
    _cfg: TestConfig,
}

impl Traced {
    async fn start(protocol: &str, ratio: f64, scopes: &str) -> Traced {
        let collector = Collector::start().await;
        let up = MockUpstream::start().await;
        let cfg = traced(&up, &collector.endpoint(), protocol, ratio);
        let path = cfg.write();
        let seed = seed(&path, "acme", "alice", "owner", scopes);
        let gw = Gateway::start(&path);
        Traced {
            collector,
            up,
            gw,
            seed,
            _cfg: cfg,
        }
    }
}

/// The upstream's `traceparent` of its last request, split in its parts.
fn upstream_traceparent(up: &MockUpstream) -> (String, String, String) {
    let seen = up.last();
    let values: Vec<_> = seen.headers.get_all("traceparent").iter().collect();
    assert_eq!(values.len(), 1, "the upstream got {values:?}");
    let v = values[0].to_str().unwrap();
    let parts: Vec<&str> = v.split('-').collect();
    assert_eq!(parts.len(), 4, "{v}");
    assert_eq!(parts[0], "00", "{v}");
    (parts[1].into(), parts[2].into(), parts[3].into())
}

/// GETs the clusters list with `key` (200 expected): the trace id of the
/// `traceparent` the upstream got.
async fn get_clusters(gw: &Gateway, up: &MockUpstream, key: &str) -> String {
    let res = client()
        .get(gw.url(CLUSTERS))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    upstream_traceparent(up).0
}

/// The access-log line of the request with `request_id`.
fn access_line(gw: &Gateway, request_id: &str) -> Value {
    gw.log
        .lock()
        .unwrap()
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["message"] == "request" && v["request_id"] == request_id)
        .unwrap_or_else(|| panic!("no access line for {request_id}:\n{}", gw.log_text()))
}

async fn access_line_soon(gw: &Gateway, request_id: &str) -> Value {
    let found = within(Duration::from_secs(5), || async {
        gw.log_text().contains(request_id)
    })
    .await;
    assert!(found.is_some(), "no access line for {request_id}");
    access_line(gw, request_id)
}

#[tokio::test]
async fn a_request_through_a_cache_miss_redis_and_an_upstream_exports_its_span_tree() {
    let collector = Collector::start().await;
    let up = MockUpstream::start().await;
    let prefix = RedisPrefix::new();
    let mut cfg = traced(&up, &collector.endpoint(), "http/protobuf", 1.0);
    cfg.redis(&redis_url(), &prefix.0);
    let path = cfg.write();
    let seed = seed(&path, "acme", "alice", "owner", "clusters:read");
    let gw = Gateway::start(&path);

    // A fresh key: the cache misses and the store is asked.
    let res = client()
        .get(gw.url(CLUSTERS))
        .bearer_auth(&seed.key)
        .header("x-request-id", "traced-1")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let (trace_id, call_span, flags) = upstream_traceparent(&up);
    assert_eq!(flags, "01", "a sampled trace is passed on sampled");

    let spans = collector.trace(&trace_id, 6).await;
    let by_name = |n: &str| -> Span {
        let found: Vec<&Span> = spans.iter().filter(|s| s.name == n).collect();
        assert_eq!(found.len(), 1, "spans named {n}: {spans:#?}");
        found[0].clone()
    };
    let server = by_name("request");
    assert_eq!(server.kind, 2, "SERVER");
    assert_eq!(server.parent, "", "a new trace's root");
    assert_eq!(server.service, "gateway-under-test");
    let a = &server.attributes;
    assert_eq!(a["http.request.method"], "GET");
    assert_eq!(a["url.path"], "/api/v1/clusters", "no query");
    assert_eq!(a["http.route"], "/api/v1/clusters");
    assert_eq!(a["http.response.status_code"], "200");
    assert_eq!(a["mpg.organization_id"], "acme");
    assert_eq!(a["mpg.key_id"], seed.key_id);
    assert!(!a.contains_key("mpg.refused_by"), "{a:?}");
    assert_eq!(server.status, 0, "unset: nothing failed");

    let lookup = by_name("store.lookup");
    assert_eq!(lookup.parent, server.span_id);
    assert_eq!(lookup.attributes["mpg.store.found"], "true");
    // On a cache miss: an auth-failure token taken before the lookup and
    // given back after it, then the decision.
    let redis: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name == "ratelimit.redis")
        .collect();
    let ops: Vec<&str> = redis
        .iter()
        .map(|s| s.attributes["mpg.ratelimit.op"].as_str())
        .collect();
    assert_eq!(ops.len(), 3, "{ops:?}");
    for op in ["check", "refund"] {
        assert!(ops.contains(&op), "{ops:?}");
    }
    for r in &redis {
        assert_eq!(r.parent, server.span_id);
        assert_eq!(r.kind, 3, "CLIENT");
        assert_eq!(r.attributes["db.system.name"], "redis");
    }
    let call = by_name("upstream");
    assert_eq!(call.parent, server.span_id);
    assert_eq!(call.kind, 3, "CLIENT");
    assert_eq!(
        call.span_id, call_span,
        "the upstream's parent is the call's span"
    );
    assert_eq!(call.attributes["server.address"], "127.0.0.1");
    assert_eq!(call.attributes["server.port"], up.addr.port().to_string());
    assert_eq!(call.attributes["http.response.status_code"], "200");
    for s in &spans {
        assert_eq!(s.trace_id, trace_id);
    }
    // Nothing of the secret reaches the collector.
    let everything = format!("{spans:?}");
    assert!(!everything.contains(&seed.key), "the key was exported");

    // The access-log line names the trace and the server span.
    let line = access_line_soon(&gw, "traced-1").await;
    assert_eq!(line["trace_id"], trace_id.as_str());
    assert_eq!(line["span_id"], server.span_id.as_str());

    // The key is cached now: a second request has no lookup span.
    let second = get_clusters(&gw, &up, &seed.key).await;
    assert_ne!(second, trace_id, "each request starts its own trace");
    let spans = collector.trace(&second, 3).await;
    let ops: Vec<&str> = spans
        .iter()
        .filter(|s| s.name == "ratelimit.redis")
        .map(|s| s.attributes["mpg.ratelimit.op"].as_str())
        .collect();
    assert_eq!(
        ops,
        ["guard_then_check"],
        "a cached key: the guard and the decision in one call"
    );
    tokio::time::sleep(Duration::from_millis(700)).await;
    let names: Vec<String> = collector
        .spans()
        .into_iter()
        .filter(|s| s.trace_id == second)
        .map(|s| s.name)
        .collect();
    assert!(
        !names.contains(&"store.lookup".to_string()),
        "{names:?} {spans:?}"
    );
    assert_eq!(collector.encodings.lock().unwrap()[0], "protobuf");
}

#[tokio::test]
async fn a_callers_sampled_trace_is_continued_whatever_the_ratio() {
    let Traced {
        collector,
        up,
        gw,
        seed,
        ..
    } = Traced::start("http/json", 0.0, "clusters:read").await;
    let caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let res = client()
        .get(gw.url(CLUSTERS))
        .bearer_auth(&seed.key)
        .header("traceparent", format!("00-{caller_trace}-{caller_span}-01"))
        .header("tracestate", "vendor=abc,other=1")
        .header("x-request-id", "continued")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let (trace_id, call_span, flags) = upstream_traceparent(&up);
    assert_eq!(trace_id, caller_trace);
    assert_ne!(
        call_span, caller_span,
        "the upstream's parent is the gateway's span"
    );
    assert_eq!(flags, "01");
    assert_eq!(
        up.last().headers["tracestate"],
        "vendor=abc,other=1",
        "a valid trace's state passes on"
    );
    let spans = collector.trace(caller_trace, 2).await;
    let server = spans.iter().find(|s| s.name == "request").unwrap();
    assert_eq!(
        server.parent, caller_span,
        "the gateway's span is the caller's child"
    );
    let call = spans.iter().find(|s| s.name == "upstream").unwrap();
    assert_eq!(call.parent, server.span_id);
    assert_eq!(call.span_id, call_span);
    assert_eq!(collector.encodings.lock().unwrap()[0], "json");
    let line = access_line_soon(&gw, "continued").await;
    assert_eq!(line["trace_id"], caller_trace);
}

#[tokio::test]
async fn an_unsampled_or_invalid_traceparent_is_never_passed_on_as_it_came() {
    let Traced {
        collector,
        up,
        gw,
        seed,
        ..
    } = Traced::start("http/protobuf", 1.0, "clusters:read").await;
    let get = |traceparent: &'static str| {
        client()
            .get(gw.url(CLUSTERS))
            .bearer_auth(&seed.key)
            .header("traceparent", traceparent)
            .header("tracestate", "vendor=abc")
    };

    // The caller did not sample: the trace goes on unsampled, nothing exported.
    let unsampled = "00-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-bbbbbbbbbbbbbbbb-00";
    assert_eq!(get(unsampled).send().await.unwrap().status(), 200);
    let (trace_id, span, flags) = upstream_traceparent(&up);
    assert_eq!(trace_id, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
    assert_ne!(span, "bbbbbbbbbbbbbbbb");
    assert_eq!(flags, "00");

    // Invalid (upper-case hex): a new trace, sampled by the ratio; the
    // caller's state goes with the value it belonged to.
    let invalid = "00-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA-BBBBBBBBBBBBBBBB-01";
    assert_eq!(get(invalid).send().await.unwrap().status(), 200);
    let (new_trace, _, flags) = upstream_traceparent(&up);
    assert_ne!(new_trace.to_lowercase(), "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
    assert_eq!(flags, "01");
    assert!(
        up.last().headers.get("tracestate").is_none(),
        "an invalid trace's state was passed on"
    );
    collector.trace(&new_trace, 2).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        collector
            .spans()
            .iter()
            .all(|s| s.trace_id != "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"),
        "an unsampled trace was exported"
    );
}

#[tokio::test]
async fn a_refusal_names_its_stage_and_sets_the_span_status() {
    let Traced {
        collector,
        gw,
        seed,
        ..
    } = Traced::start("grpc", 1.0, "clusters:write").await;
    let caller_trace = "0af7651916cd43dd8448eb211c80319c";
    let res = client()
        .get(gw.url(CLUSTERS))
        .bearer_auth("mpg_notarealkeynotarealkeynotarealkey00")
        .header(
            "traceparent",
            format!("00-{caller_trace}-b7ad6b7169203331-01"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401);
    // A scope the key lacks: refused by the authorize stage.
    let res = client()
        .get(gw.url(CLUSTERS))
        .bearer_auth(&seed.key)
        .header(
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319d-b7ad6b7169203331-01",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 403);
    let spans = collector.trace(caller_trace, 1).await;
    let server = spans.iter().find(|s| s.name == "request").unwrap();
    assert_eq!(server.attributes["mpg.refused_by"], "authenticate");
    assert_eq!(server.attributes["http.response.status_code"], "401");
    assert_eq!(server.status, 2, "ERROR");
    assert!(server.status_message.contains("Unauthorized"), "{server:?}");
    assert!(!format!("{spans:?}").contains("mpg_notarealkey"));
    let spans = collector.trace("0af7651916cd43dd8448eb211c80319d", 2).await;
    let server = spans.iter().find(|s| s.name == "request").unwrap();
    assert_eq!(server.attributes["mpg.refused_by"], "authorize");
    assert_eq!(server.attributes["http.response.status_code"], "403");
    assert_eq!(server.status, 2);
    assert!(
        spans.iter().all(|s| s.name != "upstream"),
        "a refused request reached the upstream"
    );
    assert!(collector
        .encodings
        .lock()
        .unwrap()
        .iter()
        .all(|e| *e == "grpc"));
}

#[tokio::test]
async fn retries_are_events_of_the_upstream_span() {
    let collector = Collector::start().await;
    let up = MockUpstream::start().await;
    // A target that refuses connections, then the real one.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = closed.local_addr().unwrap();
    drop(closed);
    let mut cfg = traced(&up, &collector.endpoint(), "http/protobuf", 1.0);
    cfg.set(
        "upstreams.clusters.targets",
        vec![format!("http://{dead}"), format!("http://{}", up.addr)],
    );
    cfg.set("upstreams.clusters.retries", 1);
    cfg.set("upstreams.clusters.balance", "round_robin");
    let path = cfg.write();
    let seed = seed(&path, "acme", "alice", "owner", "clusters:read");
    let gw = Gateway::start(&path);
    let mut retried = None;
    for _ in 0..4 {
        let trace_id = get_clusters(&gw, &up, &seed.key).await;
        let spans = collector.trace(&trace_id, 2).await;
        let call = spans.iter().find(|s| s.name == "upstream").unwrap().clone();
        if !call.events.is_empty() {
            retried = Some(call);
            break;
        }
    }
    let call = retried.expect("no request went to the dead target first");
    let (name, attrs) = &call.events[0];
    assert_eq!(name, "retry");
    assert_eq!(attrs["server.port"], dead.port().to_string());
    assert!(attrs.contains_key("error.message"), "{attrs:?}");
    assert_eq!(call.attributes["server.port"], up.addr.port().to_string());
}

/// A collector that accepts connections and never answers.
async fn silent_collector() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    (addr, task)
}

#[tokio::test]
async fn a_collector_down_or_silent_changes_nothing_for_clients() {
    let up = MockUpstream::start().await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let down = closed.local_addr().unwrap();
    drop(closed);
    let (silent, _task) = silent_collector().await;
    for endpoint in [format!("http://{down}"), format!("http://{silent}")] {
        let mut cfg = traced(&up, &endpoint, "http/protobuf", 1.0);
        cfg.set("rate_limit.policies.default.requests", 100_000);
        cfg.admin_on();
        let path = cfg.write();
        let seed = seed(&path, "acme", "alice", "owner", "clusters:read");
        let gw = Gateway::start(&path);
        let c = client();
        let started = Instant::now();
        for _ in 0..300 {
            let res = c
                .get(gw.url(CLUSTERS))
                .bearer_auth(&seed.key)
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), 200, "{endpoint}");
        }
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(15),
            "{endpoint}: 300 requests took {took:?}"
        );
        if endpoint.contains(&down.to_string()) {
            // Each failed batch is counted as dropped spans.
            let admin = gw.admin.unwrap();
            let counted = within(Duration::from_secs(10), || async {
                metric_sum(&metrics(admin).await, "mpg_trace_spans_dropped_total", &[]) > 0.0
            })
            .await;
            assert!(
                counted.is_some(),
                "no dropped spans counted:\n{}",
                gw.log_text()
            );
            assert!(
                gw.log_text().contains("trace collector"),
                "the lost exports were not logged"
            );
        }
    }
}

#[tokio::test]
async fn a_full_queue_drops_spans_and_counts_them() {
    let up = MockUpstream::start().await;
    let (silent, _task) = silent_collector().await;
    let mut cfg = traced(&up, &format!("http://{silent}"), "http/protobuf", 1.0);
    cfg.admin_on();
    cfg.route("method = \"GET\"\npath = \"/public/ping\"\nauth = \"none\"\nupstream = \"clusters\"\nrate_limit = \"none\"");
    let path = cfg.write();
    let gw = Gateway::start(&path);
    // Two spans a request; the queue holds 2048 and one batch of 512 is
    // stuck on the silent collector.
    let c = client();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (c, url) = (c.clone(), gw.url("/public/ping"));
        tasks.spawn(async move {
            for _ in 0..250 {
                assert_eq!(c.get(&url).send().await.unwrap().status(), 200);
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    let text = metrics(gw.admin.unwrap()).await;
    let dropped = metric_sum(&text, "mpg_trace_spans_dropped_total", &[]);
    // 4000 spans made; at most a batch in flight and a full queue held.
    assert!(dropped >= 4000.0 - 2048.0 - 512.0, "dropped {dropped}");
    assert!(dropped <= 4000.0, "dropped {dropped}");
}

#[tokio::test]
async fn a_reload_applies_the_ratio_and_the_endpoint() {
    let first = Collector::start().await;
    let second = Collector::start().await;
    let up = MockUpstream::start().await;
    let mut cfg = traced(&up, &first.endpoint(), "http/protobuf", 0.0);
    cfg.route("method = \"GET\"\npath = \"/public/ping\"\nauth = \"none\"\nupstream = \"clusters\"\nrate_limit = \"none\"");
    let path = cfg.write();
    let gw = Gateway::start(&path);
    let c = client();
    assert_eq!(
        c.get(gw.url("/public/ping")).send().await.unwrap().status(),
        200
    );
    let (unsampled, _, flags) = upstream_traceparent(&up);
    assert_eq!(flags, "00", "ratio 0 samples nothing");

    cfg.set("tracing.sample_ratio", 1.0);
    cfg.set("tracing.otlp_endpoint", second.endpoint());
    cfg.write();
    signal(gw.child.id(), "HUP");
    let reloaded = within(Duration::from_secs(10), || async {
        gw.log_text().contains("configuration reloaded")
    })
    .await;
    assert!(reloaded.is_some(), "{}", gw.log_text());
    assert_eq!(
        c.get(gw.url("/public/ping")).send().await.unwrap().status(),
        200
    );
    let (sampled, _, flags) = upstream_traceparent(&up);
    assert_eq!(flags, "01");
    second.trace(&sampled, 2).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(first.spans().is_empty(), "the old endpoint got spans");
    assert!(second.spans().iter().all(|s| s.trace_id != unsampled));
}

#[tokio::test]
async fn without_an_endpoint_traceparent_passes_through_and_nothing_is_logged_of_it() {
    let up = MockUpstream::start().await;
    let mut cfg = TestConfig::new(up.addr);
    cfg.route("method = \"GET\"\npath = \"/public/ping\"\nauth = \"none\"\nupstream = \"clusters\"\nrate_limit = \"none\"");
    let path = cfg.write();
    let gw = Gateway::start(&path);
    let v = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let res = client()
        .get(gw.url("/public/ping"))
        .header("traceparent", v)
        .header("x-request-id", "untraced")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(up.last().headers["traceparent"], v);
    let line = access_line_soon(&gw, "untraced").await;
    assert!(line.get("trace_id").is_none_or(Value::is_null), "{line}");
}

#[tokio::test]
async fn spans_still_queued_at_a_stop_are_sent_before_exit() {
    let Traced {
        collector,
        up,
        mut gw,
        seed,
        _cfg,
    } = Traced::start("http/protobuf", 1.0, "clusters:read").await;
    let trace_id = get_clusters(&gw, &up, &seed.key).await;
    // At once, before the export task's linger would send the batch (the
    // wait off this thread, where the collector answers).
    let status = tokio::task::spawn_blocking(move || gw.terminate())
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");
    let spans: Vec<Span> = collector
        .spans()
        .into_iter()
        .filter(|s| s.trace_id == trace_id)
        .collect();
    let mut names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    names.sort();
    assert_eq!(
        names,
        ["request", "store.lookup", "upstream"],
        "sent before exit"
    );
}
