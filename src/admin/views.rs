//! The admin API's read-only views of the serving gateway, for the console:
//! `GET /admin/v1/status` (version, uptime, the configuration's reloads,
//! readiness, the data plane's request counters from its own metrics, and
//! the configured roles and scopes),
//! `GET /admin/v1/routes` and `GET /admin/v1/upstreams`. Behind the admin
//! token, as the rest of `/admin/v1`.
use http::{Method, Response, StatusCode};
use serde_json::{json, Value};

use super::{json_response, Control, STORE_PING};
use crate::config::{AuthMode, Settings, UpstreamSettings};
use crate::error::GatewayError;
use crate::http_core::body::Body;
use crate::keys_service::render::rfc3339;
use crate::metrics::names;

/// The views' paths under the admin listener.
pub(super) const PATHS: [&str; 3] = [
    "/admin/v1/status",
    "/admin/v1/routes",
    "/admin/v1/upstreams",
];

/// Answers `method path` (one of [`PATHS`]) from `control`, with the
/// Prometheus text `metrics` for the request counters.
pub(super) async fn serve<C: Control>(
    control: &C,
    method: &Method,
    path: &str,
    metrics: impl FnOnce() -> String,
) -> Response<Body> {
    if method != Method::GET && method != Method::HEAD {
        return GatewayError::MethodNotAllowed {
            allow: http::HeaderValue::from_static("GET"),
        }
        .into_response();
    }
    let (_, settings) = control.store_and_settings();
    let body = match path {
        "/admin/v1/status" => status(control, &settings, &metrics()).await,
        "/admin/v1/routes" => list(routes(&settings)),
        _ => list(upstreams(control, &settings)),
    };
    json_response(StatusCode::OK, &body)
}

fn list(data: Vec<Value>) -> Value {
    json!({ "data": data, "next_cursor": null })
}

async fn status<C: Control>(control: &C, settings: &Settings, metrics: &str) -> Value {
    let store = tokio::time::timeout(STORE_PING, control.store_reachable()).await;
    let s = control.status();
    let c = control.configuration();
    let now = crate::clock::unix_now();
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "started_at": rfc3339(Some(c.started_at)),
        "uptime_seconds": (now - c.started_at).max(0),
        "config": {
            "path": c.path,
            "loaded_at": rfc3339(Some(c.loaded_at)),
            "last_reload": c.last_reload.map(|(at, problems)| json!({
                "at": rfc3339(Some(at)),
                "outcome": if problems.is_empty() { "reloaded" } else { "failed" },
                "problems": problems,
            })),
        },
        "store": if matches!(store, Ok(true)) { "ok" } else { "unreachable" },
        "rate_limiter": {
            "backend": s.limiter_backend,
            "healthy": s.limiter_healthy,
            "nodes_down": s.limiter_nodes_down,
            "instances": s.limiter_instances,
        },
        "requests": requests(metrics),
        "roles": settings.roles.names(),
        "scopes": settings.known_scopes,
    })
}

/// Every route as configured.
fn routes(settings: &Settings) -> Vec<Value> {
    let policies = &settings.rate_limit.policies;
    (settings.routes.iter())
        .map(|r| {
            json!({
                "method": r.method.as_str(),
                "path": r.path,
                "auth": match r.auth {
                    AuthMode::ApiKey => "api_key",
                    AuthMode::Session => "session",
                    AuthMode::None => "none",
                },
                "scope": r.scope,
                "rate_limit": r.rate_limit.and_then(|i| policies.get(i)).map(|p| &p.name),
                "upstream": r.upstream,
                "cost": r.cost,
            })
        })
        .collect()
}

/// Every upstream: a built-in one, or its targets' state now.
fn upstreams<C: Control>(control: &C, settings: &Settings) -> Vec<Value> {
    let targets = control.upstream_targets();
    (settings.upstreams.iter())
        .map(|(name, up)| {
            let builtin = matches!(up, UpstreamSettings::Builtin(_));
            let list = (targets.iter().find(|(n, _)| n == name))
                .map(|(_, list)| list.as_slice())
                .unwrap_or_default();
            json!({
                "name": name,
                "builtin": builtin,
                "targets": list.iter().map(|t| json!({
                    "url": t.url,
                    "state": t.state,
                    "in_flight": t.in_flight,
                    "failures": t.failures,
                    "last_error": t.last_error,
                })).collect::<Vec<_>>(),
            })
        })
        .collect()
}

/// The data plane's counters in the Prometheus text `metrics`: requests in
/// all and by status class, and the latency histogram's cumulative buckets
/// (`[le, count]`, the last `[null, count]` for `+Inf`), summed over routes.
fn requests(metrics: &str) -> Value {
    let mut total = 0u64;
    let mut classes = [0u64; 5];
    let mut buckets: Vec<(f64, u64)> = Vec::new();
    let requests = format!("{}{{", names::REQUESTS);
    let bucket = format!("{}_bucket{{", names::REQUEST_SECONDS);
    for line in metrics.lines() {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let value = value as u64;
        if series.starts_with(&requests) {
            total += value;
            let class = label(series, "status").and_then(|s| s.bytes().next());
            if let Some(c @ b'1'..=b'5') = class {
                classes[usize::from(c - b'1')] += value;
            }
        } else if series.starts_with(&bucket) {
            let le = match label(series, "le") {
                Some("+Inf") => f64::INFINITY,
                Some(le) => match le.parse() {
                    Ok(le) => le,
                    Err(_) => continue,
                },
                None => continue,
            };
            match buckets.iter_mut().find(|(b, _)| *b == le) {
                Some((_, n)) => *n += value,
                None => buckets.push((le, value)),
            }
        }
    }
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let buckets: Vec<Value> = (buckets.iter())
        .map(|&(le, n)| json!([le.is_finite().then_some(le), n]))
        .collect();
    json!({
        "total": total,
        "by_class": {
            "1xx": classes[0], "2xx": classes[1], "3xx": classes[2],
            "4xx": classes[3], "5xx": classes[4],
        },
        "duration_buckets": buckets,
    })
}

/// The value of label `name` in a series `metric{a="x",name="y"}`.
fn label<'s>(series: &'s str, name: &str) -> Option<&'s str> {
    let start = series.find(&format!("{name}=\""))? + name.len() + 2;
    let rest = &series[start..];
    Some(&rest[..rest.find('"')?])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_counters_are_summed_by_class_and_bucket() {
        let text = "\
# TYPE mpg_requests_total counter
mpg_requests_total{route=\"/a\",method=\"GET\",status=\"200\"} 5
mpg_requests_total{route=\"/b\",method=\"GET\",status=\"404\"} 2
mpg_requests_total{route=\"/b\",method=\"POST\",status=\"503\"} 1
mpg_request_duration_seconds_bucket{route=\"/a\",le=\"0.005\"} 4
mpg_request_duration_seconds_bucket{route=\"/a\",le=\"+Inf\"} 5
mpg_request_duration_seconds_bucket{route=\"/b\",le=\"0.005\"} 1
mpg_request_duration_seconds_bucket{route=\"/b\",le=\"+Inf\"} 3
mpg_request_duration_seconds_sum{route=\"/a\"} 0.01
mpg_upstream_requests_total{upstream=\"x\",status=\"200\"} 9
";
        let r = requests(text);
        assert_eq!(r["total"], 8);
        assert_eq!(r["by_class"]["2xx"], 5);
        assert_eq!(r["by_class"]["4xx"], 2);
        assert_eq!(r["by_class"]["5xx"], 1);
        assert_eq!(r["duration_buckets"], json!([[0.005, 5], [null, 8]]));
    }
}
