//! Building a running gateway from [`Settings`]: the store and its cache,
//! the limiter, the upstreams, the route table; then binding and serving.
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::admin::{names, CounterCache};
use crate::config::{
    BuiltinService, OrgSource, PolicyKey, RouteSettings, Settings, UpstreamSettings,
};
use crate::keys_service::{KeysService, Operation};
use crate::proxy::upstream::Upstream;
use crate::ratelimit::{OnBackendError, PolicyId, Quota, RateLimiter};
use crate::reload::Live;
use crate::routes::Router;
use crate::server::{serve, ListenerLimits};
use crate::store::cache::{CacheConfig, CachedKeyStore};
use crate::store::invalidation::spawn_invalidation;
use crate::store::sql::SqlStore;
use crate::store::usage::UsageRecorder;
use crate::store::StoreConfig;

/// Why the gateway could not start; each names the config part involved.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The key store could not be opened or migrated.
    #[error("store ({what}): {source}")]
    Store {
        /// The store, with any password hidden.
        what: String,
        /// The cause.
        #[source]
        source: crate::store::StoreError,
    },
    /// The rate limiter backend could not be set up.
    #[error("rate_limit: {0}")]
    Limiter(#[from] crate::ratelimit::LimiterError),
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
    /// TLS setup failed.
    #[error("server.tls: {0}")]
    Tls(#[from] crate::tls::TlsError),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Where a route's requests go.
pub(crate) enum Target {
    Http(Arc<Upstream>),
    Builtin(Operation),
}

/// One configured route, resolved for the hot path.
pub(crate) struct RouteEntry {
    pub(crate) route: RouteSettings,
    pub(crate) target: Target,
    pub(crate) policy: Option<(PolicyId, PolicyKey)>,
    /// The path parameter stage 4 or the key service needs, if any.
    pub(crate) path_param: Option<String>,
    /// Rate-limit decision counters of this route's policy: (allowed, limited).
    pub(crate) limit_counters: Option<(metrics::Counter, metrics::Counter)>,
    /// `mpg_requests_total` and the latency histogram of this route.
    pub(crate) metrics: RequestMetrics,
    /// `mpg_upstream_requests_total` of this route's upstream, by outcome.
    pub(crate) upstream_outcomes: CounterCache<&'static str>,
    /// `mpg_upstream_duration_seconds` of this route's upstream (one series
    /// per upstream, shared by its routes); `None` where nothing is recorded
    /// (the in-process key service, or no admin listener), so the request
    /// path reads no clock for it.
    pub(crate) upstream_latency: Option<metrics::Histogram>,
}

/// The per-request metric handles of one route (or of requests no route matched).
pub(crate) struct RequestMetrics {
    /// By (method, status) label.
    pub(crate) requests: CounterCache<(&'static str, &'static str)>,
    pub(crate) latency: metrics::Histogram,
}

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

/// Everything a request needs, built once from the settings.
pub struct Gateway {
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
}

/// How often other instances' (and admin commands') changes are picked up.
const INVALIDATION_POLL: Duration = Duration::from_millis(250);
/// How often `last_used_at` is written back.
const USAGE_FLUSH: Duration = Duration::from_secs(10);

impl Gateway {
    /// Opens the store (migrating it), the limiter and the upstreams.
    pub async fn build(settings: Settings) -> Result<Gateway, StartError> {
        let store = open_store(&settings).await?;
        let s = &settings.store;
        let keys = CachedKeyStore::new(
            Arc::new(store.clone()),
            CacheConfig {
                ttl: s.cache_ttl,
                negative_ttl: s.negative_cache_ttl,
                capacity: s.cache_capacity,
                negative_capacity: s.negative_cache_capacity,
                stale_if_error: s.stale_if_error,
            },
        );
        spawn_invalidation(store.clone(), keys.clone(), INVALIDATION_POLL);
        let usage = UsageRecorder::new(store.clone(), USAGE_FLUSH);
        let limiter = Arc::new(build_limiter(&settings).await?);
        Gateway::assemble(settings, store, keys, usage, limiter, None)
    }

    /// The gateway for `settings` (already validated), reusing what outlives a
    /// reload: the store, its cache, the usage recorder and the limiter, and
    /// each upstream of `previous` that `settings` leave as it was (the same
    /// `[upstreams.NAME]` and TLS file contents: see [`Upstream::serves`]),
    /// so that its targets' health, pooled connections and active checker
    /// carry on. Builds the other upstreams, the route table and the key
    /// service.
    pub(crate) fn assemble(
        settings: Settings,
        store: SqlStore,
        keys: CachedKeyStore,
        usage: UsageRecorder,
        limiter: Arc<RateLimiter>,
        previous: Option<&Gateway>,
    ) -> Result<Gateway, StartError> {
        let settings = Arc::new(settings);
        let mut upstreams = BTreeMap::new();
        for (name, u) in &settings.upstreams {
            if let UpstreamSettings::Http(cfg) = u {
                let running = previous
                    .and_then(|g| g.upstreams.get(name))
                    .filter(|up| up.serves(cfg));
                let up = match running {
                    Some(up) => up.clone(),
                    None => {
                        Arc::new(Upstream::new(name, cfg).map_err(|e| StartError::Upstream {
                            name: name.clone(),
                            reason: e.to_string(),
                        })?)
                    }
                };
                upstreams.insert(name.clone(), up);
            }
        }
        let mut router = Router::builder();
        let mut routes = Vec::with_capacity(settings.routes.len());
        for (i, route) in settings.routes.iter().enumerate() {
            router
                .insert(route.method.clone(), &route.path, i)
                .map_err(|e| StartError::Route(format!("routes[{i}]: {e}")))?;
            let target = match &settings.upstreams[&route.upstream] {
                UpstreamSettings::Http(_) => Target::Http(upstreams[&route.upstream].clone()),
                UpstreamSettings::Builtin(BuiltinService::ApiKeys) => {
                    let op = Operation::for_route(&route.method, &route.path).ok_or_else(|| {
                        StartError::Route(format!("routes[{i}]: not a key service endpoint"))
                    })?;
                    Target::Builtin(op)
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
                    metrics::counter!(crate::admin::names::RATE_LIMIT, "policy" => name.clone(), "decision" => decision)
                };
                (counter("allowed"), counter("limited"))
            });
            let upstream = route.upstream.clone();
            // Metrics are recorded only with the admin listener on (see
            // `start`); the key service, served in-process, has no upstream time.
            let upstream_latency = match &target {
                Target::Http(_) if settings.admin.listen.is_some() => Some(
                    metrics::histogram!(names::UPSTREAM_SECONDS, "upstream" => upstream.clone()),
                ),
                _ => None,
            };
            routes.push(RouteEntry {
                route: route.clone(),
                target,
                policy,
                path_param,
                metrics: RequestMetrics::new(label),
                limit_counters,
                upstream_latency,
                upstream_outcomes: CounterCache::new(move |outcome| {
                    metrics::counter!(names::UPSTREAM, "upstream" => upstream.clone(), "outcome" => *outcome)
                }),
            });
        }
        let keys_service = KeysService::new(store.clone(), keys.clone(), settings.clone());
        let router = router
            .build()
            .map_err(|e| StartError::Route(e.to_string()))?;
        Ok(Gateway {
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
        })
    }
}

impl Gateway {
    /// Whether the key store answers (for readiness).
    pub(crate) async fn store_ping(&self) -> Result<(), crate::store::StoreError> {
        use crate::store::KeyStore;
        self.store.ping().await
    }
}

/// Opens and migrates the store named by the settings.
pub async fn open_store(settings: &Settings) -> Result<SqlStore, StartError> {
    let s = &settings.store;
    if let Some(path) = s
        .url
        .strip_prefix("sqlite://")
        .and_then(|u| u.split('?').next())
    {
        if let Some(dir) = std::path::Path::new(path)
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
        {
            std::fs::create_dir_all(dir).map_err(|e| StartError::Store {
                what: s.display.clone(),
                source: crate::store::StoreError::Invalid(format!(
                    "cannot create {}: {e}",
                    dir.display()
                )),
            })?;
        }
    }
    let err = |source| StartError::Store {
        what: s.display.clone(),
        source,
    };
    let store = SqlStore::connect(&StoreConfig {
        url: s.url.clone(),
        query_timeout: s.query_timeout,
    })
    .await
    .map_err(err)?;
    store.migrate().await.map_err(err)?;
    Ok(store)
}

pub(crate) async fn build_limiter(settings: &Settings) -> Result<RateLimiter, StartError> {
    let rl = &settings.rate_limit;
    let quota = |q: &crate::config::QuotaSettings| Quota {
        capacity: q.requests,
        period: q.per,
    };
    let policies: Vec<Quota> = rl.policies.iter().map(|p| quota(&p.quota)).collect();
    let auth_failures = quota(&rl.auth_failures);
    Ok(match &rl.redis {
        None => RateLimiter::local(policies, auth_failures),
        Some(r) => {
            let on_error = match rl.on_backend_error {
                crate::config::BackendErrorPolicy::Local => OnBackendError::Local,
                crate::config::BackendErrorPolicy::Deny => OnBackendError::Deny,
                crate::config::BackendErrorPolicy::Allow => OnBackendError::Allow,
            };
            RateLimiter::redis(
                &r.url,
                &r.prefix,
                policies,
                auth_failures,
                on_error,
                r.timeout,
            )
            .await?
        }
    })
}

/// A gateway serving on a bound address; dropping the handle does not stop it.
pub struct Running {
    /// The address actually bound (useful with port 0).
    pub addr: SocketAddr,
    /// The admin listener's address, when enabled.
    pub admin_addr: Option<SocketAddr>,
    /// The serving gateway (for reloads).
    pub live: Arc<Live>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// Stops accepting, drains in-flight requests (up to `shutdown_grace`), and waits.
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// Resolves once `stop` was requested (or its sender is gone).
pub(crate) async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

/// Builds the gateway, binds `server.listen` (and `admin.listen`) and serves
/// in the background. `config_path` is what a reload re-reads.
pub async fn start(
    settings: Settings,
    config_path: Option<std::path::PathBuf>,
) -> Result<Running, StartError> {
    // The recorder first: handles made while building (route, upstream and
    // target metrics) are no-ops if made before it exists. With the admin
    // listener off (a restart-only setting) nothing can ever read a metric,
    // so none is recorded: every handle stays a no-op.
    if settings.admin.listen.is_some() {
        crate::admin::metrics_handle();
    }
    crate::logging::set_summary_interval(settings.log.summary_interval);
    let (tls, resolver) = match &settings.server.tls {
        Some(t) => {
            if *t == crate::config::TlsSettings::SelfSigned {
                tracing::warn!(
                    "serving a self-signed certificate generated in memory: for development only"
                );
            }
            let (config, resolver) = crate::tls::server_config(crate::tls::load_certified_key(t)?)?;
            (
                Some(tokio_rustls::TlsAcceptor::from(config)),
                Some(resolver),
            )
        }
        None => (None, None),
    };
    let listen = settings.server.listen;
    let limits = ListenerLimits::gateway(&settings.server.limits);
    let admin_listen = settings.admin.listen;
    let gateway = Gateway::build(settings).await?;
    let (store_display, limiter_backend) = (
        gateway.settings.store.display.clone(),
        gateway.limiter.backend(),
    );
    let usage = gateway.usage.clone();
    let live = Arc::new(Live::new(gateway, config_path, resolver));
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|source| StartError::Bind {
            addr: listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| StartError::Bind {
        addr: listen,
        source,
    })?;
    let (tx, rx) = watch::channel(false);
    let mut tasks = Vec::new();
    let mut admin_addr = None;
    if let Some(listen) = admin_listen {
        let admin = TcpListener::bind(listen)
            .await
            .map_err(|source| StartError::Bind {
                addr: listen,
                source,
            })?;
        let bound = admin.local_addr().map_err(|source| StartError::Bind {
            addr: listen,
            source,
        })?;
        tracing::info!(addr = %bound, "admin listening");
        admin_addr = Some(bound);
        let handler = Arc::new(crate::admin::Admin::new(live.clone()));
        let admin_limits = ListenerLimits {
            name: "admin",
            max_connections: 64,
            ..limits.clone()
        };
        tasks.push(tokio::spawn(serve(
            admin,
            None,
            admin_limits,
            handler,
            stopped(rx.clone()),
        )));
    }
    tracing::info!(%addr, tls = tls.is_some(), store = %store_display, limiter = limiter_backend, "listening");
    let handler = live.clone();
    tasks.push(tokio::spawn(async move {
        serve(listener, tls, limits, handler, stopped(rx)).await;
        usage.flush().await;
    }));
    Ok(Running {
        addr,
        admin_addr,
        live,
        shutdown: tx,
        tasks,
    })
}
