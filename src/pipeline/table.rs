//! The route table, compiled once from the settings: each route's
//! destination, policy and metric handles, looked up by index on the hot path.
use std::collections::BTreeMap;
use std::sync::Arc;

use crate::auth::oidc::Oidc;
use crate::config::Operation;
use crate::config::{
    BuiltinService, OrgSource, PolicyKey, PolicyMode, RouteSettings, Settings, UpstreamSettings,
};
use crate::keys_service::KeysService;
use crate::metrics::{names, CounterCache};
use crate::proxy::upstream::Upstream;
use crate::ratelimit::{PolicyId, RateLimiter};
use crate::routes::Router;
use crate::store::cache::CachedKeyStore;
use crate::store::sql::SqlStore;
use crate::store::usage::UsageRecorder;
use crate::trace::Tracer;

/// Why the route table could not be compiled; each names the config part.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// An upstream could not be built.
    #[error("upstreams.{name}: {reason}")]
    Upstream {
        /// Upstream name.
        name: String,
        /// What failed.
        reason: String,
    },
    /// Two routes the router cannot tell apart.
    #[error("routes: {0}")]
    Route(String),
    /// The identity provider's client could not be made.
    #[error("auth.oidc: {0}")]
    Oidc(String),
    /// The trace exporter could not be made.
    #[error("tracing: {0}")]
    Tracing(String),
}

/// Where a route's requests go: an HTTP upstream, or the built-in key
/// service.
pub(crate) enum Destination {
    Http(Arc<Upstream>),
    Builtin(Operation),
}

/// One configured route, resolved for the hot path.
pub(crate) struct RouteEntry {
    pub(crate) route: RouteSettings,
    pub(crate) destination: Destination,
    pub(crate) policy: Option<(PolicyId, PolicyKey)>,
    /// The path parameter stage 4 or the key service needs, if any.
    pub(crate) path_param: Option<String>,
    /// Rate-limit decision counters of this route's policy: (allowed, limited).
    pub(crate) limit_counters: Option<(metrics::Counter, metrics::Counter)>,
    /// `Some` when the route's policy is in shadow mode: it never refuses,
    /// and this counts the requests it would have refused.
    pub(crate) shadow_refusals: Option<metrics::Counter>,
    /// `mpg_requests_total` and the latency histogram of this route.
    pub(crate) metrics: RequestMetrics,
    /// `mpg_upstream_requests_total` of this route's upstream, by outcome.
    pub(crate) upstream_outcomes: CounterCache<&'static str>,
    /// `mpg_upstream_duration_seconds` of this route's upstream (one series
    /// per upstream, shared by its routes); `None` where nothing is recorded
    /// (the in-process key service, or no admin listener), so the request
    /// path reads no clock for it.
    pub(crate) upstream_latency: Option<metrics::Histogram>,
    /// The route's template and its upstream's name as trace attribute
    /// values, made once: a span takes a reference, not a copy.
    pub(crate) traced_route: opentelemetry::StringValue,
    pub(crate) traced_upstream: opentelemetry::StringValue,
    /// The upstream gets a key's `meta` (`forward_key_meta`).
    pub(crate) forward_key_meta: bool,
}

/// The per-request metric handles of one route (or of requests no route matched).
pub(crate) struct RequestMetrics {
    /// By (method, status) label.
    pub(crate) requests: CounterCache<(&'static str, &'static str)>,
    pub(crate) latency: metrics::Histogram,
}

// === impl RequestMetrics ===

impl RequestMetrics {
    pub(crate) fn new(route: metrics::SharedString) -> Self {
        let label = route.clone();
        RequestMetrics {
            requests: CounterCache::new(
                move |&(method, status)| metrics::counter!(names::REQUESTS, "route" => label.clone(), "method" => method, "status" => status),
            ),
            latency: metrics::histogram!(names::REQUEST_SECONDS, "route" => route),
        }
    }
}

/// Everything a request needs, built once from the settings: the compiled
/// route table and the services its stages call.
pub struct Pipeline {
    pub(crate) settings: Arc<Settings>,
    pub(crate) router: Router<usize>,
    pub(crate) routes: Vec<RouteEntry>,
    /// The HTTP upstreams by name (the routes hold them too).
    pub(crate) upstreams: BTreeMap<String, Arc<Upstream>>,
    pub(crate) keys: CachedKeyStore,
    pub(crate) store: SqlStore,
    pub(crate) limiter: Arc<RateLimiter>,
    pub(crate) usage: UsageRecorder,
    pub(crate) keys_service: KeysService,
    /// Request metrics of requests no route matched.
    pub(crate) unrouted: RequestMetrics,
    /// `mpg_auth_total` by (result, reason).
    pub(crate) auth_outcomes: CounterCache<(&'static str, &'static str)>,
    /// `[server.client_ip] header`, when header hygiene would not remove it
    /// anyway: a name of the operator's own choosing.
    pub(crate) client_ip_field: Option<http::HeaderName>,
    /// `[auth.oidc]`: the identity provider whose JWTs act as sessions.
    pub(crate) oidc: Option<Arc<Oidc>>,
    /// `[tracing]` with an endpoint: the sampler and the span exporter.
    pub(crate) tracer: Option<Tracer>,
}

// === impl Pipeline ===

impl Pipeline {
    /// The gateway for `settings` (already validated), reusing what outlives a
    /// reload: the store, its cache, the usage recorder and the limiter, and
    /// each upstream of `previous` that `settings` leave as it was (the same
    /// `[upstreams.NAME]` and TLS file contents: see [`Upstream::serves`]),
    /// so that its targets' health, pooled connections and active checker
    /// carry on. Builds the other upstreams, the route table and the key
    /// service.
    pub fn assemble(
        settings: Settings,
        store: SqlStore,
        keys: CachedKeyStore,
        usage: UsageRecorder,
        limiter: Arc<RateLimiter>,
        previous: Option<&Pipeline>,
    ) -> Result<Pipeline, TableError> {
        let settings = Arc::new(settings);
        let upstreams = Self::upstreams(&settings, previous)?;
        let mut router = Router::builder();
        let mut routes = Vec::with_capacity(settings.routes.len());
        for (i, route) in settings.routes.iter().enumerate() {
            router
                .insert(route.method.clone(), &route.path, i)
                .map_err(|e| TableError::Route(format!("routes[{i}]: {e}")))?;
            routes.push(RouteEntry::new(&settings, &upstreams, i, route)?);
        }
        let oidc = Self::oidc(&settings, &keys, previous)?;
        let tracer = Tracer::new(&settings.tracing, previous.and_then(|p| p.tracer.as_ref()))
            .map_err(TableError::Tracing)?;
        let keys_service = KeysService::new(store.clone(), keys.clone(), settings.clone());
        let field = &settings.server.client_ip.header;
        let client_ip_field = (!crate::proxy::headers::is_spoofable(field)).then(|| field.clone());
        let router = router
            .build()
            .map_err(|e| TableError::Route(e.to_string()))?;
        Ok(Pipeline {
            settings,
            router,
            routes,
            upstreams,
            keys,
            store,
            limiter,
            usage,
            keys_service,
            unrouted: RequestMetrics::new(metrics::SharedString::const_str("-")),
            auth_outcomes: CounterCache::new(
                |&(result, reason)| metrics::counter!(names::AUTH, "result" => result, "reason" => reason),
            ),
            client_ip_field,
            oidc,
            tracer,
        })
    }

    /// The HTTP upstreams of `settings`: those of `previous` that serve the
    /// same settings carry on, the others are built.
    fn upstreams(
        settings: &Settings,
        previous: Option<&Pipeline>,
    ) -> Result<BTreeMap<String, Arc<Upstream>>, TableError> {
        let mut upstreams = BTreeMap::new();
        for (name, u) in &settings.upstreams {
            if let UpstreamSettings::Http(cfg) = u {
                let running = previous
                    .and_then(|g| g.upstreams.get(name))
                    .filter(|up| up.serves(cfg));
                let up = match running {
                    Some(up) => up.clone(),
                    None => {
                        Arc::new(Upstream::new(name, cfg).map_err(|e| TableError::Upstream {
                            name: name.clone(),
                            reason: e.to_string(),
                        })?)
                    }
                };
                upstreams.insert(name.clone(), up);
            }
        }
        Ok(upstreams)
    }

    /// The identity provider of `[auth.oidc]`, if any. It needs a restart: a
    /// reload keeps the running provider and its key set.
    fn oidc(
        settings: &Settings,
        keys: &CachedKeyStore,
        previous: Option<&Pipeline>,
    ) -> Result<Option<Arc<Oidc>>, TableError> {
        Ok(
            match (&settings.auth.oidc, previous.and_then(|g| g.oidc.clone())) {
                (Some(_), Some(running)) => Some(running),
                (Some(cfg), None) => {
                    let oidc = Oidc::new(cfg.clone(), keys.clone()).map_err(TableError::Oidc)?;
                    oidc.spawn_refresh();
                    Some(oidc)
                }
                (None, _) => None,
            },
        )
    }
}

// === impl RouteEntry ===

impl RouteEntry {
    /// The entry of `route`, the `i`th of `settings`, with its destination
    /// among `upstreams` and its metric handles.
    fn new(
        settings: &Settings,
        upstreams: &BTreeMap<String, Arc<Upstream>>,
        i: usize,
        route: &RouteSettings,
    ) -> Result<RouteEntry, TableError> {
        let destination = match &settings.upstreams[&route.upstream] {
            UpstreamSettings::Http(_) => Destination::Http(upstreams[&route.upstream].clone()),
            UpstreamSettings::Builtin(BuiltinService::ApiKeys) => {
                let op = Operation::for_route(&route.method, &route.path).ok_or_else(|| {
                    TableError::Route(format!("routes[{i}]: not a key service endpoint"))
                })?;
                Destination::Builtin(op)
            }
        };
        let path_param = match &route.organization {
            OrgSource::Path(n) | OrgSource::Key(n) => Some(n.clone()),
            _ if route.path.contains("{id}") => Some("id".to_string()),
            _ => None,
        };
        let policy = route
            .rate_limit
            .map(|p| (PolicyId(p), settings.rate_limit.policies[p].key));
        let label = metrics::SharedString::from_shared(Arc::<str>::from(route.path.as_str()));
        let limit_counters = route.rate_limit.map(|p| {
            let name = settings.rate_limit.policies[p].name.clone();
            let counter = |decision: &'static str| {
                metrics::counter!(names::RATE_LIMIT, "policy" => name.clone(), "decision" => decision)
            };
            (counter("allowed"), counter("limited"))
        });
        let shadow_refusals = route
            .rate_limit
            .map(|p| &settings.rate_limit.policies[p])
            .filter(|p| p.mode == PolicyMode::Shadow)
            .map(|p| {
                metrics::counter!(names::RATE_LIMIT_SHADOW_REFUSALS, "policy" => p.name.clone())
            });
        let upstream = route.upstream.clone();
        // Metrics are recorded only with the admin listener on (see
        // `start`); the key service, served in-process, has no upstream time.
        let upstream_latency = match &destination {
            Destination::Http(_) if settings.admin.listen.is_some() => {
                Some(metrics::histogram!(names::UPSTREAM_SECONDS, "upstream" => upstream.clone()))
            }
            _ => None,
        };
        Ok(RouteEntry {
            route: route.clone(),
            destination,
            policy,
            path_param,
            metrics: RequestMetrics::new(label),
            limit_counters,
            shadow_refusals,
            upstream_latency,
            traced_route: Arc::<str>::from(route.path.as_str()).into(),
            traced_upstream: Arc::<str>::from(route.upstream.as_str()).into(),
            forward_key_meta: match &settings.upstreams[&route.upstream] {
                UpstreamSettings::Http(h) => h.forward_key_meta,
                UpstreamSettings::Builtin(_) => false,
            },
            upstream_outcomes: CounterCache::new(
                move |outcome| metrics::counter!(names::UPSTREAM, "upstream" => upstream.clone(), "outcome" => *outcome),
            ),
        })
    }
}

impl Pipeline {
    /// Whether the key store answers (for readiness).
    pub async fn store_ping(&self) -> Result<(), crate::store::StoreError> {
        use crate::store::KeyStore;
        self.store.ping().await
    }
}
