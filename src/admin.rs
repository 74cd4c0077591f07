//! The admin listener (`[admin]`, loopback by default): `/healthz` (the
//! process is alive), `/readyz` (config loaded, store reachable, limiter
//! state), `/metrics` (Prometheus text), `POST /reload`, and the admin API
//! under `/admin/v1` (`api`, behind an admin token). Never exposes a
//! secret; answers only requests that name it, and reloads only for a
//! client that is not a browser page (`guard`). How the admin API and the
//! admin commands show accounts is `render`.
pub(crate) mod api;
mod console;
mod guard;
pub mod render;
mod views;

pub use guard::AllowedHosts;

use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::config::Settings;
use crate::error::GatewayError;
use crate::http_core::body::{self, Body, RequestBody};
use crate::http_core::service::{ConnInfo, Handler, Refusal, Reply};
use crate::metrics::{metrics_handle, names};
use crate::store::sql::SqlStore;

/// What the admin listener asks of the gateway it serves. The app
/// implements it; the admin listener sees nothing else of the gateway.
pub trait Control: Send + Sync + 'static {
    /// Whether the key store answers.
    fn store_reachable(&self) -> impl Future<Output = bool> + Send;
    /// The serving gateway's state, for `/readyz` and `/metrics`.
    fn status(&self) -> Status;
    /// Re-reads the configuration and swaps it in, or changes nothing and
    /// says why, one problem a line.
    fn reload(&self) -> impl Future<Output = Result<Reloaded, Vec<String>>> + Send;
    /// The store and settings the admin API works on (the live ones).
    fn store_and_settings(&self) -> (SqlStore, Arc<Settings>);
    /// When the gateway started, and its configuration's file and reloads.
    fn configuration(&self) -> Configuration;
    /// Each HTTP upstream's targets as they stand now, by upstream name.
    fn upstream_targets(&self) -> Vec<(String, Vec<crate::proxy::TargetView>)>;
}

/// The serving gateway's configuration, for the console's overview.
#[derive(Debug, Clone, Default)]
pub struct Configuration {
    /// When the gateway started (unix seconds).
    pub started_at: i64,
    /// The file it was read from, if any.
    pub path: Option<String>,
    /// When the serving configuration was loaded (unix seconds).
    pub loaded_at: i64,
    /// The last reload asked for: when, and the problems that refused it
    /// (none: it was reloaded).
    pub last_reload: Option<(i64, Vec<String>)>,
}

/// The serving gateway's state.
#[derive(Debug, Clone)]
pub struct Status {
    /// `local` or `redis`.
    pub limiter_backend: &'static str,
    /// Whether the limiter's backend answers (false: in fallback).
    pub limiter_healthy: bool,
    /// On a Redis Cluster, the primaries whose slots' decisions fall back now.
    pub limiter_nodes_down: Vec<String>,
    /// With Redis, the gateway instances that share it, as last counted
    /// (this one included); 1 on the local backend.
    pub limiter_instances: u64,
    /// Configured routes.
    pub routes: usize,
    /// Key-cache entries, positive and negative.
    pub cache_entries: u64,
    /// "Not found" key-cache entries.
    pub cache_negative_entries: u64,
    /// A stop signal came: the gateway still serves, but asks not to be sent
    /// new traffic (`/readyz` says 503).
    pub stopping: bool,
}

/// What a successful reload did.
#[derive(Debug, Default)]
pub struct Reloaded {
    /// Settings that changed in the file but only take effect after a restart.
    pub restart_needed: Vec<&'static str>,
    /// Whether a certificate was (re)loaded from disk.
    pub certificate_reloaded: bool,
    /// The upstreams built anew (added, or changed); every other one was
    /// kept running as it was.
    pub upstreams_rebuilt: Vec<String>,
}

/// How long `/readyz` waits for the store.
const STORE_PING: Duration = Duration::from_secs(2);

/// Serves the admin endpoints for one gateway.
pub struct Admin<C> {
    control: Arc<C>,
    metrics: PrometheusHandle,
    hosts: AllowedHosts,
}

impl<C: Control> Admin<C> {
    /// An admin handler for the serving gateway, answering requests that name `hosts`.
    pub fn new(control: Arc<C>, hosts: AllowedHosts) -> Self {
        Admin {
            control,
            metrics: metrics_handle(),
            hosts,
        }
    }

    async fn ready(&self) -> Response<Body> {
        let store = tokio::time::timeout(STORE_PING, self.control.store_reachable()).await;
        let store_ok = matches!(store, Ok(true));
        let status = self.control.status();
        let ready = store_ok && !status.stopping;
        let body = json!({
            "status": match (status.stopping, store_ok) {
                (true, _) => "stopping",
                (false, true) => "ready",
                (false, false) => "not_ready",
            },
            "config": "loaded",
            "store": if store_ok { "ok" } else { "unreachable" },
            "rate_limiter": {
                "backend": status.limiter_backend,
                "healthy": status.limiter_healthy,
                "nodes_down": status.limiter_nodes_down,
                "instances": status.limiter_instances,
            },
            "routes": status.routes,
        });
        // A limiter in fallback still serves (per on_backend_error): ready, but said.
        json_response(
            if ready {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            },
            &body,
        )
    }

    async fn reload(&self) -> Response<Body> {
        match self.control.reload().await {
            Ok(outcome) => json_response(
                StatusCode::OK,
                &json!({
                    "status": "reloaded",
                    "restart_needed": outcome.restart_needed,
                    "certificate_reloaded": outcome.certificate_reloaded,
                    "upstreams_rebuilt": outcome.upstreams_rebuilt,
                }),
            ),
            Err(problems) => json_response(
                StatusCode::BAD_REQUEST,
                &json!({
                    "error": "BadRequest",
                    "message": "the configuration was not reloaded; the running configuration stays",
                    "details": { "problems": problems },
                }),
            ),
        }
    }
}

impl<C: Control> Handler for Admin<C> {
    type Stamp = ();

    async fn handle(&self, req: Request<RequestBody>, conn: Arc<ConnInfo>) -> Reply {
        self.answer(req, &conn).await.into()
    }

    fn refuse(&self, refusal: Refusal) -> Response<Body> {
        GatewayError::from(refusal).into_response()
    }
}

impl<C: Control> Admin<C> {
    async fn answer(&self, req: Request<RequestBody>, conn: &ConnInfo) -> Response<Body> {
        let (head, body) = req.into_parts();
        if !self.hosts.allow(&head) {
            return GatewayError::MisdirectedRequest.into_response();
        }
        if views::PATHS.contains(&head.uri.path()) {
            let (store, _) = self.control.store_and_settings();
            if let Err(e) = api::authenticate(&store, &head.headers).await {
                return e.into_response();
            }
            let metrics = || crate::metrics::render(&self.metrics);
            return views::serve(&*self.control, &head.method, head.uri.path(), metrics).await;
        }
        if head.uri.path().starts_with(api::PREFIX) {
            let (store, settings) = self.control.store_and_settings();
            let req = Request::from_parts(head, body);
            return api::serve(&store, &settings, req, conn.source_ip()).await;
        }
        if head.uri.path() == "/reload" {
            if head.method != Method::POST {
                return GatewayError::MethodNotAllowed {
                    allow: HeaderValue::from_static("POST"),
                }
                .into_response();
            }
            if guard::cross_site(&head) {
                return GatewayError::ForbiddenRequest {
                    reason: "cross_site",
                    message: "the admin listener refuses a request a browser page could send (an Origin field, or a form body type); send POST /reload with neither",
                }
                .into_response();
            }
            return self.reload().await;
        }
        if head.method != Method::GET && head.method != Method::HEAD {
            return GatewayError::MethodNotAllowed {
                allow: HeaderValue::from_static("GET, HEAD"),
            }
            .into_response();
        }
        match head.uri.path() {
            p if p == console::PREFIX || p.starts_with("/console/") => console::serve(p),
            "/healthz" => json_response(StatusCode::OK, &json!({ "status": "ok" })),
            "/readyz" => self.ready().await,
            "/metrics" => {
                let status = self.control.status();
                metrics::gauge!(names::CACHE_ENTRIES).set(status.cache_entries as f64);
                metrics::gauge!(names::CACHE_NEGATIVE_ENTRIES)
                    .set(status.cache_negative_entries as f64);
                let mut res = Response::new(body::full(crate::metrics::render(&self.metrics)));
                res.headers_mut().insert(
                    CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
                );
                res
            }
            _ => GatewayError::NotFound.into_response(),
        }
    }
}

fn json_response(status: StatusCode, v: &serde_json::Value) -> Response<Body> {
    let mut res = Response::new(body::full(v.to_string()));
    *res.status_mut() = status;
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    res
}
